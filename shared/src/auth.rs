//! Bearer-token authentication and roles (DESIGN §7). Tokens live in a TOML file as SHA-256
//! hashes, each mapped to a principal with roles; a tonic interceptor checks every call and puts
//! the `Principal` into the request's extensions for the handlers' permission checks.
//!
//! Without a tokens file authentication is off: every caller is the `anonymous` principal with
//! every role, and the binaries refuse to bind anything but loopback unless told `--insecure`.

use std::{collections::HashMap, path::Path, sync::Arc};

use serde::Deserialize;
use sha2::{Digest, Sha256};
use tonic::{Request, Status, metadata::MetadataMap, service::Interceptor};

/// What a principal may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Registers trees, submits runs, supplies user input and external results.
    Submitter,
    /// Decides approvals in approval-svc.
    Approver,
    /// Everything an operator needs: jobs, requeue, cancel, interrupt, audit.
    Operator,
    /// A service identity (approval-svc): the only role that may resolve approval suspensions.
    Service,
    /// A task worker: takes leased tasks and completes, fails or heartbeats them.
    Worker,
    /// Reads everything both services hold (runs, events, jobs, tasks, approvals, audit) and
    /// changes nothing: for dashboards and auditors.
    Reader,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::Submitter,
        Role::Approver,
        Role::Operator,
        Role::Service,
        Role::Worker,
        Role::Reader,
    ];

    /// The role named `name` as the tokens file spells it (`approver`), if there is one.
    pub fn parse(name: &str) -> Option<Role> {
        Role::ALL
            .into_iter()
            .find(|r| format!("{r:?}").eq_ignore_ascii_case(name))
    }

    /// The roles that read everything a service holds, whoever it belongs to.
    pub const READ_ALL: [Role; 3] = [Role::Operator, Role::Service, Role::Reader];
}

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub roles: Vec<Role>,
    /// The approver groups the principal belongs to (`group:NAME` in approval rules).
    pub groups: Vec<String>,
}

impl Principal {
    /// The caller when authentication is off: it may do everything.
    pub fn anonymous() -> Self {
        Self {
            name: "anonymous".into(),
            roles: Role::ALL.to_vec(),
            groups: Vec::new(),
        }
    }

    pub fn has(&self, role: Role) -> bool {
        self.roles.contains(&role)
    }

    pub fn has_any(&self, roles: &[Role]) -> bool {
        roles.iter().any(|r| self.has(*r))
    }

    /// Whether the principal reads everything (operator, service or reader), not only what is
    /// its own.
    pub fn reads_all(&self) -> bool {
        self.has_any(&Role::READ_ALL)
    }

    /// PERMISSION_DENIED unless the principal holds one of `roles`.
    pub fn require(&self, roles: &[Role], action: &str) -> Result<(), Status> {
        if self.has_any(roles) {
            Ok(())
        } else {
            Err(Status::permission_denied(format!(
                "principal '{}' may not {action} (needs one of: {})",
                self.name,
                roles
                    .iter()
                    .map(|r| format!("{r:?}").to_lowercase())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
    }
}

/// The principals a tokens file names, by name. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    by_name: Arc<HashMap<String, Principal>>,
}

impl Directory {
    /// A directory of `principals` (tests, and a service that builds one itself).
    pub fn of(principals: impl IntoIterator<Item = Principal>) -> Self {
        Self {
            by_name: Arc::new(
                principals
                    .into_iter()
                    .map(|p| (p.name.clone(), p))
                    .collect(),
            ),
        }
    }

    pub fn get(&self, name: &str) -> Option<&Principal> {
        self.by_name.get(name)
    }

    /// The names of the members of `group`, sorted.
    pub fn members(&self, group: &str) -> Vec<String> {
        self.select(|p| p.groups.iter().any(|g| g == group))
    }

    /// The names of the principals holding `role`, sorted.
    pub fn holders(&self, role: Role) -> Vec<String> {
        self.select(|p| p.has(role))
    }

    fn select(&self, keep: impl Fn(&Principal) -> bool) -> Vec<String> {
        let mut names: Vec<String> = self
            .by_name
            .values()
            .filter(|p| keep(p))
            .map(|p| p.name.clone())
            .collect();
        names.sort();
        names
    }
}

/// Whether `name` may name a group: letters, digits, `-`, `_` and `.`, not empty.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// The principal a request was authenticated as. Handlers behind an `AuthInterceptor` always find
/// one; without it (unit tests of handlers) the caller is anonymous.
pub fn principal_of<T>(req: &Request<T>) -> Principal {
    req.extensions()
        .get::<Principal>()
        .cloned()
        .unwrap_or_else(Principal::anonymous)
}

#[derive(Debug, thiserror::Error)]
pub enum AuthConfigError {
    #[error("cannot read tokens file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("tokens file {path} is invalid: {message}")]
    Invalid { path: String, message: String },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default, rename = "principal")]
    principals: Vec<PrincipalEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PrincipalEntry {
    name: String,
    roles: Vec<Role>,
    /// Approver groups (`group:NAME` in approval rules).
    #[serde(default)]
    groups: Vec<String>,
    /// Hex SHA-256 of the bearer token; the token itself is never stored.
    token_sha256: String,
    /// RFC 3339 time after which the token is refused.
    #[serde(default)]
    expires_at: Option<String>,
}

#[derive(Debug, Clone)]
struct Credential {
    principal: Principal,
    expires_at: Option<std::time::SystemTime>,
}

/// Token hashes → principals. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Authenticator {
    by_hash: Arc<HashMap<[u8; 32], Credential>>,
    enabled: bool,
}

/// Hex SHA-256 of a token, as written in the tokens file (`runner-svc hash-token` prints it).
pub fn hash_token(token: &str) -> String {
    hex_encode(&Sha256::digest(token.as_bytes()))
}

impl Authenticator {
    /// Authentication off: every call is anonymous.
    pub fn disabled() -> Self {
        Self::default()
    }

    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Loads a tokens file (TOML, `[[principal]]` tables with `name`, `roles`, `token_sha256`
    /// and optional `expires_at`).
    pub fn from_file(path: &Path) -> Result<Self, AuthConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| AuthConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| AuthConfigError::Invalid {
            path: path.display().to_string(),
            message,
        })
    }

    pub fn from_toml(text: &str) -> Result<Self, String> {
        let file: TokensFile = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.principals.is_empty() {
            return Err("no [[principal]] entries".into());
        }
        let mut by_hash = HashMap::new();
        for (i, p) in file.principals.into_iter().enumerate() {
            let hash = hex_decode_32(&p.token_sha256)
                .ok_or_else(|| format!("principal[{i}].token_sha256 must be 64 hex characters"))?;
            if p.name.trim().is_empty() {
                return Err(format!("principal[{i}].name must not be empty"));
            }
            if p.roles.is_empty() {
                return Err(format!("principal[{i}].roles must not be empty"));
            }
            if let Some(g) = p.groups.iter().find(|g| !valid_name(g)) {
                return Err(format!(
                    "principal[{i}].groups: {g:?} is not a group name (letters, digits, '-', '_' and '.')"
                ));
            }
            let expires_at = match p.expires_at {
                None => None,
                Some(s) => Some(humantime::parse_rfc3339(&s).map_err(|e| {
                    format!("principal[{i}].expires_at is not an RFC 3339 time: {e}")
                })?),
            };
            let cred = Credential {
                principal: Principal {
                    name: p.name,
                    roles: p.roles,
                    groups: p.groups,
                },
                expires_at,
            };
            if by_hash.insert(hash, cred).is_some() {
                return Err(format!("principal[{i}] reuses another principal's token"));
            }
        }
        Ok(Self {
            by_hash: Arc::new(by_hash),
            enabled: true,
        })
    }

    /// Every principal the tokens file names, with its roles and groups (those of all its
    /// tokens together), by name: what approval rules resolve `user:`, `group:` and `role:`
    /// against. Empty when authentication is off.
    pub fn directory(&self) -> Directory {
        let mut by_name: HashMap<String, Principal> = HashMap::new();
        for cred in self.by_hash.values() {
            let p = &cred.principal;
            let entry = by_name.entry(p.name.clone()).or_insert_with(|| Principal {
                name: p.name.clone(),
                roles: Vec::new(),
                groups: Vec::new(),
            });
            for r in &p.roles {
                if !entry.roles.contains(r) {
                    entry.roles.push(*r);
                }
            }
            for g in &p.groups {
                if !entry.groups.contains(g) {
                    entry.groups.push(g.clone());
                }
            }
        }
        Directory {
            by_name: Arc::new(by_name),
        }
    }

    /// Checks the `authorization: Bearer …` header.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Principal, Status> {
        if !self.enabled {
            return Ok(Principal::anonymous());
        }
        let header = metadata
            .get("authorization")
            .ok_or_else(|| Status::unauthenticated("missing authorization: Bearer <token>"))?;
        let header = header
            .to_str()
            .map_err(|_| Status::unauthenticated("authorization header is not ASCII"))?;
        let token = header
            .strip_prefix("Bearer ")
            .or_else(|| header.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| Status::unauthenticated("authorization must be 'Bearer <token>'"))?;
        let hash: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let cred = self
            .by_hash
            .get(&hash)
            .ok_or_else(|| Status::unauthenticated("unknown token"))?;
        if let Some(expiry) = cred.expires_at
            && std::time::SystemTime::now() >= expiry
        {
            return Err(Status::unauthenticated("token expired"));
        }
        Ok(cred.principal.clone())
    }
}

/// Tonic interceptor: authenticates and stores the `Principal` in the request extensions.
#[derive(Debug, Clone)]
pub struct AuthInterceptor(pub Authenticator);

impl Interceptor for AuthInterceptor {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        let principal = self.0.authenticate(req.metadata())?;
        req.extensions_mut().insert(principal);
        Ok(req)
    }
}

/// Client side: adds `authorization: Bearer <token>` to every outgoing call when a token is set.
#[derive(Debug, Clone, Default)]
pub struct BearerToken(pub Option<tonic::metadata::AsciiMetadataValue>);

impl BearerToken {
    pub fn new(token: Option<&str>) -> Result<Self, Status> {
        match token.map(str::trim).filter(|t| !t.is_empty()) {
            None => Ok(Self(None)),
            Some(t) => format!("Bearer {t}")
                .parse()
                .map(|v| Self(Some(v)))
                .map_err(|_| Status::invalid_argument("token is not valid ASCII")),
        }
    }
}

impl Interceptor for BearerToken {
    fn call(&mut self, mut req: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex_decode_32(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, chunk) in s.as_bytes().chunks(2).enumerate() {
        let pair = std::str::from_utf8(chunk).ok()?;
        out[i] = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(token: Option<&str>) -> MetadataMap {
        let mut m = MetadataMap::new();
        if let Some(t) = token {
            m.insert("authorization", format!("Bearer {t}").parse().unwrap());
        }
        m
    }

    fn auth() -> Authenticator {
        let toml = format!(
            r#"
            [[principal]]
            name = "alice"
            roles = ["approver"]
            groups = ["payments", "ops"]
            token_sha256 = "{}"

            [[principal]]
            name = "old"
            roles = ["submitter"]
            token_sha256 = "{}"
            expires_at = "2001-01-01T00:00:00Z"
            "#,
            hash_token("alice-token"),
            hash_token("old-token")
        );
        Authenticator::from_toml(&toml).unwrap()
    }

    #[test]
    fn known_token_maps_to_its_principal() {
        let p = auth().authenticate(&md(Some("alice-token"))).unwrap();
        assert_eq!(p.name, "alice");
        assert!(p.has(Role::Approver) && !p.has(Role::Service));
    }

    #[test]
    fn the_directory_resolves_groups_and_roles() {
        let p = auth().authenticate(&md(Some("alice-token"))).unwrap();
        assert_eq!(p.groups, ["payments", "ops"]);
        let dir = auth().directory();
        assert_eq!(dir.members("payments"), ["alice"]);
        assert!(dir.members("nobody").is_empty());
        assert_eq!(dir.holders(Role::Submitter), ["old"]);
        let bad = format!(
            "[[principal]]\nname = \"a\"\nroles = [\"approver\"]\ngroups = [\"pay ments\"]\ntoken_sha256 = \"{}\"",
            hash_token("t")
        );
        let err = Authenticator::from_toml(&bad).unwrap_err();
        assert!(
            err.contains("principal[0].groups") && err.contains("pay ments"),
            "{err}"
        );
    }

    #[test]
    fn missing_unknown_and_expired_tokens_are_unauthenticated() {
        let a = auth();
        for token in [None, Some("nope"), Some("old-token")] {
            let err = a.authenticate(&md(token)).unwrap_err();
            assert_eq!(err.code(), tonic::Code::Unauthenticated, "{token:?}");
        }
    }

    #[test]
    fn disabled_auth_is_anonymous_with_every_role() {
        let p = Authenticator::disabled().authenticate(&md(None)).unwrap();
        assert!(Role::ALL.iter().all(|r| p.has(*r)));
    }

    #[test]
    fn bad_files_are_rejected_with_a_reason() {
        assert!(Authenticator::from_toml("").is_err());
        let bad_hash = "[[principal]]\nname='a'\nroles=['operator']\ntoken_sha256='xyz'";
        assert!(
            Authenticator::from_toml(bad_hash)
                .unwrap_err()
                .contains("64 hex")
        );
        let bad_role = format!(
            "[[principal]]\nname='a'\nroles=['root']\ntoken_sha256='{}'",
            hash_token("t")
        );
        assert!(Authenticator::from_toml(&bad_role).is_err());
    }

    #[test]
    fn require_names_the_missing_roles() {
        let p = Principal {
            name: "bob".into(),
            roles: vec![Role::Submitter],
            groups: Vec::new(),
        };
        let err = p
            .require(&[Role::Service], "resolve approvals")
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied);
        assert!(err.message().contains("service"));
    }

    #[test]
    fn readers_read_all_and_submitters_do_not() {
        let with = |roles: Vec<Role>| Principal {
            name: "p".into(),
            roles,
            groups: Vec::new(),
        };
        assert!(with(vec![Role::Reader]).reads_all());
        assert!(with(vec![Role::Operator]).reads_all());
        assert!(with(vec![Role::Service]).reads_all());
        assert!(!with(vec![Role::Submitter, Role::Approver, Role::Worker]).reads_all());
        let file = format!(
            "[[principal]]\nname='dash'\nroles=['reader']\ntoken_sha256='{}'",
            hash_token("t")
        );
        let p = Authenticator::from_toml(&file)
            .unwrap()
            .authenticate(&md(Some("t")))
            .unwrap();
        assert_eq!(p.roles, [Role::Reader]);
    }
}
