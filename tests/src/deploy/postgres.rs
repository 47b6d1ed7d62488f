//! The store half of the deploy checks: where each service keeps its state (sled on a PVC, or
//! PostgreSQL from a Secret), whether env references resolve in the render, whether a store URL
//! reaches the database it names with that database's credentials, and the bundled dev
//! PostgreSQL (Kubernetes StatefulSet or compose service) itself.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{labels_match, name_of, str_list, volume_mounts};

/// The image's defaults where the manifest says nothing.
const DEFAULT_PGDATA: &str = "/var/lib/postgresql/data";
const DEFAULT_PORT: i64 = 5432;

/// Where a service container keeps its state.
pub(super) enum Store<'a> {
    /// `--data-dir` (the embedded store).
    Sled,
    /// `ARBOR_STORE`; the Secret and key it comes from, unless given (wrongly) as a literal.
    Postgres(Option<(&'a str, &'a str)>),
}

/// Whether the container is the bundled PostgreSQL (the official image).
pub(super) fn is_database(c: &Value) -> bool {
    let image = c["image"].as_str().unwrap_or("");
    let name = image.split([':', '@']).next().unwrap_or("");
    name.rsplit('/').next() == Some("postgres")
}

/// Every `valueFrom`/`envFrom` reference of the container must name an object of the render
/// that has the key (unless marked optional): a missing one keeps the pod from starting.
pub(super) fn check_env_refs(who: &str, c: &Value, docs: &[Value], errors: &mut Vec<String>) {
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap_or("?");
        for (field, kind) in [("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")] {
            let r = &e["valueFrom"][field];
            if r.is_null() || r["optional"] == true {
                continue;
            }
            let object = r["name"].as_str().unwrap_or("");
            let key = r["key"].as_str().unwrap_or("");
            match find(docs, kind, object) {
                None => errors.push(format!(
                    "{who}: env {name} comes from {kind} {object}, which is not in the render"
                )),
                Some(o) if !has_key(o, key) => {
                    errors.push(format!(
                        "{who}: env {name}: {kind} {object} has no key {key}"
                    ));
                }
                Some(_) => {}
            }
        }
    }
    for e in c["envFrom"].as_array().into_iter().flatten() {
        for (field, kind) in [("secretRef", "Secret"), ("configMapRef", "ConfigMap")] {
            let r = &e[field];
            let object = r["name"].as_str().unwrap_or("");
            if !r.is_null() && r["optional"] != true && find(docs, kind, object).is_none() {
                errors.push(format!(
                    "{who}: envFrom {kind} {object} is not in the render"
                ));
            }
        }
    }
}

/// Which store the container uses. The URL holds the database password, so it must come from
/// a Secret: `--store` or a literal `ARBOR_STORE` in a manifest is an error.
pub(super) fn store_of<'a>(who: &str, c: &'a Value, errors: &mut Vec<String>) -> Store<'a> {
    let literal_flag = str_list(&c["args"])
        .iter()
        .any(|a| a == "--store" || a.starts_with("--store="));
    let env = c["env"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e["name"] == "ARBOR_STORE");
    let from_secret = env.and_then(|e| {
        let r = &e["valueFrom"]["secretKeyRef"];
        Some((r["name"].as_str()?, r["key"].as_str()?))
    });
    if literal_flag || (env.is_some() && from_secret.is_none()) {
        errors.push(format!(
            "{who}: the store URL holds a password; give it as ARBOR_STORE from a Secret \
             (valueFrom.secretKeyRef), not as a literal"
        ));
    }
    if literal_flag || env.is_some() {
        Store::Postgres(from_secret.filter(|_| !literal_flag))
    } else {
        Store::Sled
    }
}

/// The URL in `secret`/`key` must be a PostgreSQL URL; when its host is a Service of the render
/// (a bare name or `*.svc…`), the port must be one of that Service's, and when that Service
/// selects the bundled database, user, password and database must be the ones it is created
/// with. A managed database's host (anything else) is taken as is.
pub(super) fn check_store_url(
    who: &str,
    secret: &str,
    key: &str,
    docs: &[Value],
    errors: &mut Vec<String>,
) {
    // A missing Secret or key is reported by check_env_refs; base64 `data` is not read here.
    let Some(url) = find(docs, "Secret", secret).and_then(|s| s["stringData"][key].as_str()) else {
        return;
    };
    let Some(url) = PgUrl::parse(url) else {
        errors.push(format!(
            "{who}: ARBOR_STORE ({secret}/{key}) is not a postgres:// URL"
        ));
        return;
    };
    if url.host.contains('.') && !url.host.contains(".svc") {
        return;
    }
    let svc_name = url.host.split('.').next().unwrap_or("");
    let Some(svc) = find(docs, "Service", svc_name) else {
        errors.push(format!(
            "{who}: ARBOR_STORE host {} is not a Service here",
            url.host
        ));
        return;
    };
    let ports: Vec<i64> = svc["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["port"].as_i64())
        .collect();
    if !ports.contains(&url.port) {
        errors.push(format!(
            "{who}: ARBOR_STORE port {} is not a port of Service {svc_name} ({ports:?})",
            url.port
        ));
    }
    for workload in docs
        .iter()
        .filter(|d| d["kind"] == "StatefulSet" || d["kind"] == "Deployment")
    {
        let tpl = &workload["spec"]["template"];
        if !labels_match(&svc["spec"]["selector"], &tpl["metadata"]["labels"]) {
            continue;
        }
        for c in tpl["spec"]["containers"].as_array().into_iter().flatten() {
            if is_database(c) {
                let env = |name: &str| k8s_env_value(c, name, docs);
                let expected = Credentials::of_image(env);
                expected.compare(who, &url, &name_of(workload), errors);
            }
        }
    }
}

/// The bundled database: one server whose data is on a PVC, with a password, and ready only
/// when `pg_isready` says so.
pub(super) fn check_database(
    who: &str,
    c: &Value,
    replicas: i64,
    pvcs: &BTreeSet<String>,
    errors: &mut Vec<String>,
) {
    if replicas != 1 {
        errors.push(format!(
            "{who}: {replicas} replicas of the bundled PostgreSQL would be {replicas} separate \
             databases; it is one server"
        ));
    }
    if !str_list(&c["readinessProbe"]["exec"]["command"])
        .iter()
        .any(|a| a == "pg_isready")
    {
        errors.push(format!("{who}: the readinessProbe must run pg_isready"));
    }
    let env = |name: &str| {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
    };
    let pgdata = env("PGDATA")
        .and_then(|e| e["value"].as_str())
        .unwrap_or(DEFAULT_PGDATA);
    let on_pvc = volume_mounts(c)
        .iter()
        .any(|(n, p)| pvcs.contains(n) && (pgdata == p || pgdata.starts_with(&format!("{p}/"))));
    if !on_pvc {
        errors.push(format!(
            "{who}: PGDATA {pgdata} is not on a PVC: the database would not survive its pod"
        ));
    }
    if env("POSTGRES_PASSWORD").is_none() && env("POSTGRES_PASSWORD_FILE").is_none() {
        errors.push(format!(
            "{who}: no POSTGRES_PASSWORD: the image refuses to initialise without one"
        ));
    }
}

/// A compose service running the database: the others wait for its healthcheck.
pub(super) fn check_compose_database(who: &str, svc: &Value, errors: &mut Vec<String>) {
    let test = str_list(&svc["healthcheck"]["test"]).join(" ");
    if !test.contains("pg_isready") {
        errors.push(format!(
            "{who}: needs a healthcheck with pg_isready (the services wait for it)"
        ));
    }
}

/// A compose service's `--store` URL must reach a database service of the file, with its
/// credentials, once that service is healthy.
pub(super) fn check_compose_store(
    who: &str,
    url: &str,
    svc: &Value,
    services: &serde_json::Map<String, Value>,
    errors: &mut Vec<String>,
) {
    let Some(url) = PgUrl::parse(url) else {
        errors.push(format!("{who}: --store {url} is not a postgres:// URL"));
        return;
    };
    // A compose service has `image` where a container has it.
    let Some(db) = services.get(url.host).filter(|d| is_database(d)) else {
        errors.push(format!(
            "{who}: --store host {} is not a PostgreSQL service of this file",
            url.host
        ));
        return;
    };
    let env = |name: &str| db["environment"][name].as_str().map(str::to_string);
    let port = env("PGPORT")
        .and_then(|p| p.parse().ok())
        .unwrap_or(DEFAULT_PORT);
    if url.port != port {
        errors.push(format!(
            "{who}: --store port {} is not {}'s port {port}",
            url.port, url.host
        ));
    }
    Credentials::of_image(env).compare(who, &url, url.host, errors);
    if svc["depends_on"][url.host]["condition"] != "service_healthy" {
        errors.push(format!(
            "{who}: must depend on {} with condition: service_healthy",
            url.host
        ));
    }
}

/// The parts of `postgres://user:password@host:port/database` the checks compare.
struct PgUrl<'a> {
    user: Option<&'a str>,
    password: Option<&'a str>,
    host: &'a str,
    port: i64,
    database: Option<&'a str>,
}

impl<'a> PgUrl<'a> {
    fn parse(url: &'a str) -> Option<PgUrl<'a>> {
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let database = path.split('?').next().filter(|d| !d.is_empty());
        let (userinfo, hostport) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let (user, password) = match userinfo.map(|u| u.split_once(':')) {
            Some(Some((u, p))) => (Some(u), Some(p)),
            Some(None) => (userinfo, None),
            None => (None, None),
        };
        let (host, port) = match hostport.rsplit_once(':') {
            Some((h, p)) => (h, p.parse().ok()?),
            None => (hostport, DEFAULT_PORT),
        };
        (!host.is_empty()).then_some(PgUrl {
            user,
            password,
            host,
            port,
            database,
        })
    }
}

/// What the official image creates on first start, from its environment.
struct Credentials {
    user: String,
    password: Option<String>,
    database: String,
}

impl Credentials {
    fn of_image(env: impl Fn(&str) -> Option<String>) -> Credentials {
        let user = env("POSTGRES_USER").unwrap_or_else(|| "postgres".into());
        Credentials {
            database: env("POSTGRES_DB").unwrap_or_else(|| user.clone()),
            password: env("POSTGRES_PASSWORD"),
            user,
        }
    }

    fn compare(&self, who: &str, url: &PgUrl<'_>, db: &str, errors: &mut Vec<String>) {
        let checks = [
            ("user", url.user, Some(self.user.as_str()), "POSTGRES_USER"),
            (
                "database",
                url.database,
                Some(self.database.as_str()),
                "POSTGRES_DB",
            ),
            (
                "password",
                url.password,
                self.password.as_deref(),
                "POSTGRES_PASSWORD",
            ),
        ];
        for (what, got, want, var) in checks {
            // An unreadable expectation (a password file, base64 data) is not compared.
            if let Some(want) = want
                && got != Some(want)
            {
                errors.push(format!("{who}: the store URL's {what} is not {db}'s {var}"));
            }
        }
    }
}

/// An env var's value in a Kubernetes container: literal, or from a Secret's `stringData` or a
/// ConfigMap's `data` of the render.
fn k8s_env_value(c: &Value, name: &str, docs: &[Value]) -> Option<String> {
    let e = c["env"].as_array()?.iter().find(|e| e["name"] == name)?;
    if let Some(v) = e["value"].as_str() {
        return Some(v.to_string());
    }
    let lookups = [
        ("secretKeyRef", "Secret", "stringData"),
        ("configMapKeyRef", "ConfigMap", "data"),
    ];
    lookups.iter().find_map(|(field, kind, data)| {
        let r = &e["valueFrom"][*field];
        let object = find(docs, kind, r["name"].as_str()?)?;
        object[*data][r["key"].as_str()?]
            .as_str()
            .map(str::to_string)
    })
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn has_key(object: &Value, key: &str) -> bool {
    ["data", "stringData", "binaryData"]
        .iter()
        .any(|f| !object[*f][key].is_null())
}

/// `published` host ports of a compose port entry: `None` when Docker picks one.
pub(super) fn compose_host_ports(entry: &str) -> Option<usize> {
    let parts: Vec<&str> = entry.split(':').collect();
    let host = match parts.as_slice() {
        [_container] => return None,
        [host, _container] | [_, host, _container] => *host,
        _ => return None,
    };
    if host.is_empty() {
        return None;
    }
    match host.split_once('-') {
        Some((a, b)) => {
            let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
            Some(b.saturating_sub(a) + 1)
        }
        None => Some(1),
    }
}

/// Checks shared by both compose shapes: a service's replicas against its store and ports.
pub(super) fn check_compose_replicas(
    who: &str,
    svc: &Value,
    postgres: bool,
    data_dir: Option<&str>,
    errors: &mut Vec<String>,
) {
    let replicas = svc["deploy"]["replicas"].as_i64().unwrap_or(1);
    if !postgres {
        if replicas != 1 {
            errors.push(format!(
                "{who}: {replicas} replicas of a sled store, which is a single writer"
            ));
        }
        let volumes: BTreeMap<String, String> = str_list(&svc["volumes"])
            .iter()
            .filter_map(|v| {
                let mut parts = v.split(':');
                Some((parts.nth(1)?.to_string(), v.clone()))
            })
            .collect();
        match data_dir {
            Some(dir) if volumes.keys().any(|t| dir.starts_with(t.as_str())) => {}
            other => errors.push(format!("{who}: --data-dir {other:?} is not on a volume")),
        }
    }
    for entry in str_list(&svc["ports"]) {
        if let Some(n) = compose_host_ports(&entry)
            && (n as i64) < replicas
        {
            errors.push(format!(
                "{who}: port {entry} has {n} host port(s) for {replicas} replicas; the others \
                 cannot bind (give a range, e.g. 50061-50062:50051)"
            ));
        }
    }
}
