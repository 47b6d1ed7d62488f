//! Authentication fixtures: a tokens file with one principal per role (plus a principal holding
//! two roles and an expired one, and any people a test adds, with their approver groups), the
//! token file approval-svc presents to the runner, and the service arguments that turn
//! authentication on.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use arbor_shared::auth::hash_token;

/// The principals every secured cluster knows, with their bearer tokens.
#[derive(Debug, Clone)]
pub struct Tokens {
    pub file: PathBuf,
    pub runner_token_file: PathBuf,
    /// `sam`: registers trees, submits runs, answers user input and external work.
    pub submitter: String,
    /// `alice`: decides approvals.
    pub approver: String,
    /// `olga`: jobs, requeue, cancel, interrupt, audit.
    pub operator: String,
    /// `approval-svc`: the service identity approval-svc calls the runner with.
    pub service: String,
    /// `bob`: submitter and approver at once (may still not approve his own runs).
    pub submitter_approver: String,
    /// `old`: a submitter whose token expired in 2001.
    pub expired: String,
    /// `wendy`: a task worker.
    pub worker: String,
    /// `rita`: reads everything, changes nothing (a dashboard).
    pub reader: String,
    /// The token of each [`Person`] the test added, by name.
    pub people: BTreeMap<String, String>,
}

/// A principal a test adds to the tokens file: a name (one already there gets a second token,
/// with these roles and groups added to its own), roles and approver groups.
#[derive(Debug, Clone)]
pub struct Person {
    pub name: String,
    pub roles: Vec<&'static str>,
    pub groups: Vec<String>,
}

impl Person {
    pub fn new(name: &str, roles: &[&'static str], groups: &[&str]) -> Person {
        Person {
            name: name.to_string(),
            roles: roles.to_vec(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
        }
    }
}

pub const SUBMITTER: &str = "sam";
pub const APPROVER: &str = "alice";
pub const OPERATOR: &str = "olga";
pub const SERVICE: &str = "approval-svc";
pub const SUBMITTER_APPROVER: &str = "bob";
pub const WORKER: &str = "wendy";
pub const READER: &str = "rita";

impl Tokens {
    /// Writes the tokens file and the runner token file into `dir`. Tokens are random per
    /// cluster, so a test can never pass by accident on a token another test wrote.
    pub fn write(dir: &Path) -> Tokens {
        Self::write_with(dir, &[])
    }

    /// [`write`](Self::write), with `people` added.
    pub fn write_with(dir: &Path, people: &[Person]) -> Tokens {
        let token = |who: &str| format!("{who}-{}", uuid::Uuid::new_v4().simple());
        let t = Tokens {
            file: dir.join("tokens.toml"),
            runner_token_file: dir.join("runner-token"),
            submitter: token(SUBMITTER),
            approver: token(APPROVER),
            operator: token(OPERATOR),
            service: token(SERVICE),
            submitter_approver: token(SUBMITTER_APPROVER),
            expired: token("old"),
            worker: token(WORKER),
            reader: token(READER),
            people: people
                .iter()
                .map(|p| (p.name.clone(), token(&p.name)))
                .collect(),
        };
        let entry = |name: &str, roles: &str, tok: &str, extra: &str| {
            format!(
                "[[principal]]\nname = \"{name}\"\nroles = [{roles}]\ntoken_sha256 = \"{}\"\n{extra}\n",
                hash_token(tok)
            )
        };
        let text = [
            entry(SUBMITTER, "\"submitter\"", &t.submitter, ""),
            entry(APPROVER, "\"approver\"", &t.approver, ""),
            entry(OPERATOR, "\"operator\"", &t.operator, ""),
            entry(SERVICE, "\"service\"", &t.service, ""),
            entry(
                SUBMITTER_APPROVER,
                "\"submitter\", \"approver\"",
                &t.submitter_approver,
                "",
            ),
            entry(WORKER, "\"worker\"", &t.worker, ""),
            entry(READER, "\"reader\"", &t.reader, ""),
            entry(
                "old",
                "\"submitter\"",
                &t.expired,
                "expires_at = \"2001-01-01T00:00:00Z\"",
            ),
        ]
        .into_iter()
        .chain(people.iter().map(|p| {
            let quoted = |items: &[String]| {
                items
                    .iter()
                    .map(|i| format!("{i:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let roles: Vec<String> = p.roles.iter().map(|r| r.to_string()).collect();
            let groups = format!("groups = [{}]", quoted(&p.groups));
            entry(&p.name, &quoted(&roles), &t.people[&p.name], &groups)
        }))
        .collect::<Vec<_>>()
        .join("\n");
        std::fs::write(&t.file, text).expect("write tokens file");
        std::fs::write(&t.runner_token_file, format!("{}\n", t.service))
            .expect("write runner token file");
        t
    }

    /// The token of `name`: a person the test added, or one of the built-in principals.
    pub fn of(&self, name: &str) -> &str {
        match name {
            SUBMITTER => &self.submitter,
            APPROVER => &self.approver,
            OPERATOR => &self.operator,
            SERVICE => &self.service,
            SUBMITTER_APPROVER => &self.submitter_approver,
            WORKER => &self.worker,
            READER => &self.reader,
            _ => self
                .people
                .get(name)
                .unwrap_or_else(|| panic!("no principal {name:?} in the tokens file")),
        }
    }

    /// Arguments that turn authentication on for runner-svc.
    pub fn runner_args(&self) -> Vec<String> {
        vec!["--tokens".into(), self.file.display().to_string()]
    }

    /// Arguments that turn authentication on for approval-svc and give it its service token.
    pub fn approval_args(&self) -> Vec<String> {
        vec![
            "--tokens".into(),
            self.file.display().to_string(),
            "--runner-token-file".into(),
            self.runner_token_file.display().to_string(),
        ]
    }
}
