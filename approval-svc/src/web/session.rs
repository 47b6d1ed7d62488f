//! Sign-in, sessions and CSRF. A person pastes their token once (or a trusted proxy names
//! them in a header); the inbox keeps a random 128-bit session id in an HttpOnly,
//! SameSite=Strict cookie and the token in memory on the server, never in a URL or anywhere a
//! script can read it. Each request checks the token again against the tokens file, so a
//! session ends when its token expires or is removed; a session unused for `IDLE` ends too.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use arbor_shared::auth::Principal;
use axum::{
    body::Bytes,
    extract::State,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Redirect, Response},
};
use tonic::metadata::{MetadataMap, MetadataValue};

use super::{Shared, page};
use crate::store::ApprovalStore;

/// The cookie holding the session id.
pub const COOKIE: &str = "arbor_session";
/// A session nobody used for this long ends (tokens without an expiry keep it no longer).
pub const IDLE: Duration = Duration::from_secs(8 * 3600);
/// Most sessions kept at once; the least recently used goes first beyond it.
const MAX_SESSIONS: usize = 10_000;

#[derive(Debug, Clone)]
struct Session {
    name: String,
    /// The pasted token (token sign-in), presented to the runner on the person's behalf.
    token: Option<String>,
    csrf: String,
    seen: Instant,
    /// What the next page says about the last action (set before a redirect).
    flash: Option<String>,
}

/// The sessions of this process, in memory: a restart signs everyone out.
#[derive(Debug, Clone, Default)]
pub struct Sessions {
    by_id: Arc<Mutex<HashMap<String, Session>>>,
}

/// The signed-in person of one request.
#[derive(Debug, Clone)]
pub struct Person {
    pub principal: Principal,
    pub csrf: String,
    pub token: Option<String>,
    sid: String,
}

impl Person {
    pub fn name(&self) -> &str {
        &self.principal.name
    }
}

/// 128 bits from the operating system's CSPRNG, as hex.
fn random_id() -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)?;
    Ok(hex::encode(bytes))
}

/// Equal without telling how much matched by how long it took.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl Sessions {
    fn open(&self, name: &str, token: Option<String>) -> Result<(String, Session), Response> {
        let (sid, csrf) = match (random_id(), random_id()) {
            (Ok(s), Ok(c)) => (s, c),
            _ => {
                return Err(page::error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "no randomness",
                ));
            }
        };
        let session = Session {
            name: name.to_string(),
            token,
            csrf,
            seen: Instant::now(),
            flash: None,
        };
        let mut all = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        all.retain(|_, s| s.seen.elapsed() < IDLE);
        if all.len() >= MAX_SESSIONS
            && let Some(oldest) = all
                .iter()
                .min_by_key(|(_, s)| s.seen)
                .map(|(k, _)| k.clone())
        {
            all.remove(&oldest);
        }
        all.insert(sid.clone(), session.clone());
        Ok((sid, session))
    }

    fn touch(&self, sid: &str) -> Option<Session> {
        let mut all = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        let s = all.get_mut(sid)?;
        if s.seen.elapsed() >= IDLE {
            all.remove(sid);
            return None;
        }
        s.seen = Instant::now();
        Some(s.clone())
    }

    fn set_flash(&self, sid: &str, text: String) {
        let mut all = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = all.get_mut(sid) {
            s.flash = Some(text);
        }
    }

    fn take_flash(&self, sid: &str) -> Option<String> {
        let mut all = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        all.get_mut(sid).and_then(|s| s.flash.take())
    }

    fn drop_session(&self, sid: &str) {
        self.by_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(sid);
    }

    /// How many sessions are open (for tests and the log).
    pub fn len(&self) -> usize {
        self.by_id
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn cookie_of(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == COOKIE)
        .map(|(_, v)| v.to_string())
}

impl<S: ApprovalStore> super::Web<S> {
    fn check_token(&self, token: &str) -> Result<Principal, String> {
        let mut md = MetadataMap::new();
        let value = MetadataValue::try_from(format!("Bearer {token}"))
            .map_err(|_| "a token is printable ASCII".to_string())?;
        md.insert("authorization", value);
        self.auth
            .authenticate(&md)
            .map_err(|s| s.message().to_string())
    }

    /// The principal a trusted proxy names in the identity header, if it names a known one.
    fn proxied(&self, headers: &HeaderMap) -> Option<Principal> {
        let h = self.cfg.identity_header.as_ref()?;
        let name = headers.get(h)?.to_str().ok()?.trim();
        if !self.auth.is_enabled() {
            return Some(Principal::anonymous());
        }
        self.auth.directory().get(name).cloned()
    }

    /// The signed-in person of a request: a live session whose token (or proxy identity)
    /// still names the same principal.
    pub fn person(&self, headers: &HeaderMap) -> Option<Person> {
        let sid = cookie_of(headers)?;
        let s = self.sessions.touch(&sid)?;
        let principal = match (&s.token, &self.cfg.identity_header) {
            (Some(token), _) => self.check_token(token).ok(),
            (None, Some(_)) => self.proxied(headers),
            (None, None) => None,
        };
        match principal {
            Some(p) if p.name == s.name => Some(Person {
                principal: p,
                csrf: s.csrf,
                token: s.token,
                sid,
            }),
            _ => {
                self.sessions.drop_session(&sid);
                None
            }
        }
    }

    /// Says `text` on `p`'s next page (after the redirect that follows an action).
    pub fn flash(&self, p: &Person, text: impl Into<String>) {
        self.sessions.set_flash(&p.sid, text.into());
    }

    /// What the last action left to say, once.
    pub fn take_flash(&self, p: &Person) -> String {
        self.sessions.take_flash(&p.sid).unwrap_or_default()
    }

    fn set_cookie(&self, sid: &str) -> HeaderValue {
        let secure = if self.cfg.secure_cookie {
            "; Secure"
        } else {
            ""
        };
        let v = format!("{COOKIE}={sid}; Path=/; HttpOnly; SameSite=Strict{secure}");
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    fn clear_cookie(&self) -> HeaderValue {
        let secure = if self.cfg.secure_cookie {
            "; Secure"
        } else {
            ""
        };
        let v = format!("{COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0{secure}");
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    fn signed_in(&self, name: &str, token: Option<String>) -> Response {
        match self.sessions.open(name, token) {
            Ok((sid, _)) => {
                tracing::info!(principal = name, "signed in to the web inbox");
                let mut res = Redirect::to("/queue").into_response();
                res.headers_mut()
                    .insert(header::SET_COOKIE, self.set_cookie(&sid));
                res
            }
            Err(res) => res,
        }
    }
}

/// A submitted form's fields, in order; a name may repeat.
#[derive(Debug, Default)]
pub struct Fields(pub Vec<(String, String)>);

impl Fields {
    pub fn parse(body: &[u8]) -> Self {
        Self(form_urlencoded::parse(body).into_owned().collect())
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self, name: &str) -> String {
        self.get(name).unwrap_or_default().to_string()
    }

    pub fn all(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .collect()
    }
}

/// 403 for a POST another site's page sent (the browser says so in `Sec-Fetch-Site`, or an
/// `Origin` naming another host): a second line behind the CSRF token and SameSite, and the
/// only one for the sign-in form, which has no session yet.
fn same_site(headers: &HeaderMap) -> Result<(), Response> {
    let text = |h: header::HeaderName| headers.get(h).and_then(|v| v.to_str().ok());
    let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    let cross = match (fetch_site, text(header::ORIGIN), text(header::HOST)) {
        (Some(site), _, _) => !matches!(site, "same-origin" | "none"),
        (None, Some(origin), Some(host)) if origin != "null" => {
            origin.split_once("://").map(|(_, h)| h) != Some(host)
        }
        _ => false,
    };
    match cross {
        true => Err(page::error(
            StatusCode::FORBIDDEN,
            "This form was sent from another site. Nothing was changed.",
        )),
        false => Ok(()),
    }
}

/// The person and the form of a POST, or the response refusing it: no session (redirect to
/// sign-in) or no or a wrong CSRF token (403, nothing changed).
pub fn post_of<S: ApprovalStore>(
    w: &super::Web<S>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Person, Fields), Response> {
    same_site(headers)?;
    let Some(person) = w.person(headers) else {
        return Err(Redirect::to("/sign-in").into_response());
    };
    let fields = Fields::parse(body);
    match fields.get("csrf") {
        Some(given) if same(given, &person.csrf) => Ok((person, fields)),
        _ => Err(page::error(
            StatusCode::FORBIDDEN,
            "This form is out of date or did not come from the inbox (its CSRF token is \
             missing or wrong). Nothing was changed; reload the page and try again.",
        )),
    }
}

pub async fn sign_in_page<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
) -> Response {
    if w.person(&headers).is_some() {
        return Redirect::to("/queue").into_response();
    }
    if w.cfg.identity_header.is_some() {
        return match w.proxied(&headers) {
            Some(p) => w.signed_in(&p.name, None),
            None => page::sign_in(
                StatusCode::UNAUTHORIZED,
                true,
                "The proxy in front of the inbox did not name a person this service knows.",
            ),
        };
    }
    page::sign_in(StatusCode::OK, false, "")
}

pub async fn sign_in<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if w.cfg.identity_header.is_some() {
        return sign_in_page(State(w), headers).await;
    }
    if let Err(res) = same_site(&headers) {
        return res;
    }
    let fields = Fields::parse(&body);
    let token = fields.text("token").trim().to_string();
    if token.is_empty() {
        return page::sign_in(StatusCode::UNAUTHORIZED, false, "Paste your token.");
    }
    match w.check_token(&token) {
        Ok(p) => w.signed_in(&p.name, Some(token)),
        Err(why) => page::sign_in(
            StatusCode::UNAUTHORIZED,
            false,
            &format!("That token was refused: {why}."),
        ),
    }
}

pub async fn sign_out<S: ApprovalStore>(
    State(w): State<Shared<S>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (person, _) = match post_of(&w, &headers, &body) {
        Ok(p) => p,
        Err(res) => return res,
    };
    w.sessions.drop_session(&person.sid);
    tracing::info!(principal = person.name(), "signed out of the web inbox");
    let mut res = Redirect::to("/sign-in").into_response();
    res.headers_mut()
        .insert(header::SET_COOKIE, w.clear_cookie());
    res
}
