//! Consistency checks of `deploy/` against what the real binaries accept: every flag and env
//! name a manifest, compose file or Dockerfile gives a service must appear in that binary's
//! `serve --help`; ports, probe ports, Service port names, mounted files, drain timing, the
//! store (sled on a PVC, or PostgreSQL from a Secret) and the Istio resources must agree with
//! each other. Each check returns readable errors, so a test can also prove that a broken copy
//! of a manifest is caught.

mod postgres;

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

/// What `SERVICE serve --help` says the binary accepts.
#[derive(Debug, Clone, Default)]
pub struct Help {
    /// Long flag → whether it takes a value.
    pub flags: BTreeMap<String, bool>,
    pub env: BTreeSet<String>,
    /// Long flag → default value.
    pub defaults: BTreeMap<String, String>,
}

impl Help {
    /// Parses clap's long help (`--flag <VALUE>` lines followed by `[env: X=] [default: Y]`).
    pub fn parse(text: &str) -> Help {
        let mut help = Help::default();
        let mut current: Option<String> = None;
        for line in text.lines() {
            let t = line.trim_start();
            let flag_part = t
                .strip_prefix("-h, ")
                .or_else(|| {
                    t.get(..4)
                        .filter(|p| p.starts_with('-') && p.ends_with(", "))
                        .map(|_| &t[4..])
                })
                .unwrap_or(t);
            if let Some(rest) = flag_part.strip_prefix("--") {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                let after = &rest[name.len()..];
                let takes_value = after.trim_start().starts_with('<');
                help.flags.insert(name.clone(), takes_value);
                current = Some(name);
            }
            let mut rest = t;
            while let Some(i) = rest.find("[env: ") {
                let tail = &rest[i + 6..];
                let name: String = tail
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                help.env.insert(name);
                rest = tail;
            }
            if let (Some(i), Some(flag)) = (t.find("[default: "), current.as_ref()) {
                let tail = &t[i + 10..];
                if let Some(end) = tail.find(']') {
                    help.defaults.insert(flag.clone(), tail[..end].to_string());
                }
            }
        }
        help
    }

    pub fn env_for(&self, flag: &str) -> String {
        format!("ARBOR_{}", flag.replace('-', "_").to_uppercase())
    }
}

/// The two binaries' help, by container/service name.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub runner: Help,
    pub approval: Help,
}

impl Binaries {
    fn for_name(&self, name: &str) -> Option<(&Help, Role)> {
        if name.contains("runner") {
            Some((&self.runner, Role::Runner))
        } else if name.contains("approval") {
            Some((&self.approval, Role::Approval))
        } else {
            None
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Runner,
    Approval,
}

/// The settings a container ends up with: flags from args, else env, else the default.
#[derive(Debug, Default)]
struct Settings {
    values: BTreeMap<String, String>,
    switches: BTreeSet<String>,
}

impl Settings {
    fn get(&self, flag: &str) -> Option<&str> {
        self.values.get(flag).map(String::as_str)
    }
}

/// Checks `args` (after the subcommand) and env names against `help`; returns the settings.
fn check_invocation(
    who: &str,
    help: &Help,
    args: &[String],
    env: &[(String, String)],
    errors: &mut Vec<String>,
) -> Settings {
    let mut s = Settings::default();
    match args.first().map(String::as_str) {
        Some("serve") => {}
        other => errors.push(format!(
            "{who}: first argument must be `serve`, got {other:?}"
        )),
    }
    let mut i = 1;
    while i < args.len() {
        let arg = &args[i];
        i += 1;
        let Some(body) = arg.strip_prefix("--") else {
            errors.push(format!("{who}: unexpected positional argument {arg:?}"));
            continue;
        };
        let (name, inline) = match body.split_once('=') {
            Some((n, v)) => (n.to_string(), Some(v.to_string())),
            None => (body.to_string(), None),
        };
        match help.flags.get(&name) {
            None => errors.push(format!("{who}: `serve` has no flag --{name}")),
            Some(true) => {
                let value = inline.or_else(|| {
                    let v = args.get(i).cloned();
                    i += 1;
                    v
                });
                match value {
                    Some(v) => {
                        s.values.insert(name, v);
                    }
                    None => errors.push(format!("{who}: --{name} needs a value")),
                }
            }
            Some(false) => {
                if inline.is_some() {
                    errors.push(format!("{who}: --{name} is a switch and takes no value"));
                }
                s.switches.insert(name);
            }
        }
    }
    for (name, value) in env {
        if name == "RUST_LOG" {
            continue;
        }
        if !help.env.contains(name) {
            errors.push(format!("{who}: env {name} is not read by the binary"));
            continue;
        }
        // The flag whose env this is, if it was not given as an argument.
        if let Some((flag, _)) = help.flags.iter().find(|(f, _)| help.env_for(f) == *name)
            && !s.values.contains_key(flag)
            && !s.switches.contains(flag)
        {
            s.values.insert(flag.clone(), value.clone());
        }
    }
    for (flag, default) in &help.defaults {
        s.values
            .entry(flag.clone())
            .or_insert_with(|| default.clone());
    }
    s
}

fn port_of(addr: &str) -> Option<i64> {
    addr.rsplit_once(':')?.1.parse().ok()
}

fn str_list(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn labels_match(selector: &Value, labels: &Value) -> bool {
    selector
        .as_object()
        .is_some_and(|sel| !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v)))
}

fn name_of(doc: &Value) -> String {
    format!(
        "{}/{}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// A pod template with its resolved container facts.
struct Pod<'a> {
    owner: String,
    labels: &'a Value,
    /// Container port name → number.
    ports: BTreeMap<String, i64>,
    grpc: Option<i64>,
    metrics: Option<i64>,
    /// An Arbor service (not the bundled database).
    arbor: bool,
    replicas: i64,
}

/// Container port name → number.
fn container_ports(c: &Value) -> BTreeMap<String, i64> {
    c["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| {
            Some((
                p["name"].as_str()?.to_string(),
                p["containerPort"].as_i64()?,
            ))
        })
        .collect()
}

/// (volume name, mount path) of a container.
fn volume_mounts(c: &Value) -> Vec<(String, String)> {
    c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| {
            Some((
                m["name"].as_str()?.to_string(),
                m["mountPath"].as_str()?.to_string(),
            ))
        })
        .collect()
}

/// Checks rendered Kubernetes documents (one overlay) against the binaries.
pub fn check_manifests(docs: &[Value], bins: &Binaries) -> Vec<String> {
    let mut errors = Vec::new();
    let by_kind =
        |kind: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == kind).collect() };
    let mut pods: Vec<Pod<'_>> = Vec::new();
    let mut seen_roles = BTreeSet::new();

    let workloads = docs
        .iter()
        .filter(|d| d["kind"] == "StatefulSet" || d["kind"] == "Deployment");
    for workload in workloads {
        let owner = name_of(workload);
        let spec = &workload["spec"];
        let tpl = &spec["template"];
        let replicas = spec["replicas"].as_i64().unwrap_or(1);
        if !labels_match(&spec["selector"]["matchLabels"], &tpl["metadata"]["labels"]) {
            errors.push(format!(
                "{owner}: selector does not match the pod template labels"
            ));
        }
        let claims: BTreeSet<String> = spec["volumeClaimTemplates"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        let volumes: BTreeMap<String, &Value> = tpl["spec"]["volumes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|v| Some((v["name"].as_str()?.to_string(), v)))
            .collect();
        // Volumes that outlive the pod: claim templates and PersistentVolumeClaim volumes.
        let pvcs: BTreeSet<String> = volumes
            .iter()
            .filter(|(_, v)| !v["persistentVolumeClaim"].is_null())
            .map(|(n, _)| n.clone())
            .chain(claims.iter().cloned())
            .collect();
        if workload["kind"] == "StatefulSet" {
            let governing = spec["serviceName"].as_str().unwrap_or("");
            let headless = docs.iter().any(|d| {
                d["kind"] == "Service"
                    && d["metadata"]["name"] == governing
                    && d["spec"]["clusterIP"] == "None"
                    && labels_match(&d["spec"]["selector"], &tpl["metadata"]["labels"])
            });
            if !headless {
                errors.push(format!(
                    "{owner}: serviceName {governing:?} is not a headless Service selecting its pods"
                ));
            }
        }
        for c in tpl["spec"]["containers"].as_array().into_iter().flatten() {
            let cname = c["name"].as_str().unwrap_or("?").to_string();
            let who = format!("{owner} container {cname}");
            postgres::check_env_refs(&who, c, docs, &mut errors);
            let Some((help, role)) = bins.for_name(&cname) else {
                if postgres::is_database(c) {
                    postgres::check_database(&who, c, replicas, &pvcs, &mut errors);
                    pods.push(Pod {
                        owner: owner.clone(),
                        labels: &tpl["metadata"]["labels"],
                        ports: container_ports(c),
                        grpc: None,
                        metrics: None,
                        arbor: false,
                        replicas,
                    });
                } else {
                    errors.push(format!("{who}: not an Arbor service container"));
                }
                continue;
            };
            seen_roles.insert(format!("{role:?}"));
            let env: Vec<(String, String)> = c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap_or("").to_string(),
                        e["value"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect();
            let settings = check_invocation(&who, help, &str_list(&c["args"]), &env, &mut errors);
            let ports = container_ports(c);
            let listen = settings.get("listen").and_then(port_of);
            let metrics = settings
                .get("metrics-listen")
                .filter(|m| !m.eq_ignore_ascii_case("off"))
                .and_then(port_of);
            match (listen, ports.get("grpc")) {
                (Some(l), Some(p)) if l == *p => {}
                (l, p) => errors.push(format!(
                    "{who}: container port `grpc` ({p:?}) must be the --listen port ({l:?})"
                )),
            }
            if let Some(m) = metrics {
                match ports.get("metrics") {
                    Some(p) if *p == m => {}
                    p => errors.push(format!(
                        "{who}: container port `metrics` ({p:?}) must be the --metrics-listen port ({m})"
                    )),
                }
            }
            for probe in ["startupProbe", "readinessProbe", "livenessProbe"] {
                let p = &c[probe];
                if p.is_null() {
                    errors.push(format!("{who}: no {probe}"));
                    continue;
                }
                match p["grpc"]["port"].as_i64() {
                    Some(port) if Some(port) == listen => {}
                    Some(port) => errors.push(format!(
                        "{who}: {probe} checks port {port}, but gRPC health is served on {listen:?}"
                    )),
                    None => errors.push(format!("{who}: {probe} must be a native gRPC probe")),
                }
            }
            for key in ["requests", "limits"] {
                if c["resources"][key]["memory"].is_null() || c["resources"][key]["cpu"].is_null() {
                    errors.push(format!("{who}: resources.{key} needs cpu and memory"));
                }
            }
            // Files given by flag must come from a mounted ConfigMap/Secret key.
            let mounts = volume_mounts(c);
            for flag in ["policy", "tokens", "runner-token-file", "guards"] {
                let Some(path) = settings.get(flag) else {
                    continue;
                };
                check_mounted_file(&who, flag, path, &mounts, &volumes, docs, &mut errors);
            }
            match postgres::store_of(&who, c, &mut errors) {
                // Replicas on one database keep nothing of their own.
                postgres::Store::Postgres(from_secret) => {
                    if let Some((secret, key)) = from_secret {
                        postgres::check_store_url(&who, secret, key, docs, &mut errors);
                    }
                    for (name, path) in mounts.iter().filter(|(n, _)| pvcs.contains(n)) {
                        errors.push(format!(
                            "{who}: mounts the PVC volume {name} at {path}, but its state is in \
                             PostgreSQL (ARBOR_STORE): replicas must be stateless"
                        ));
                    }
                }
                postgres::Store::Sled => {
                    match settings.get("data-dir") {
                        Some(dir)
                            if mounts
                                .iter()
                                .any(|(n, p)| pvcs.contains(n) && dir.starts_with(p.as_str())) => {}
                        other => errors.push(format!(
                            "{who}: --data-dir {other:?} is not on a volumeClaimTemplate mount"
                        )),
                    }
                    if replicas != 1 {
                        errors.push(format!(
                            "{owner}: {replicas} replicas of a sled store, which is a single \
                             writer (replicas: 1, or ARBOR_STORE on PostgreSQL)"
                        ));
                    }
                }
            }
            let grace_ms: i64 = settings
                .get("drain-grace-ms")
                .and_then(|g| g.parse().ok())
                .unwrap_or(0);
            let term = tpl["spec"]["terminationGracePeriodSeconds"]
                .as_i64()
                .unwrap_or(30);
            // Drain grace + up to 10 s of in-flight calls + a margin for the final flush.
            if term * 1000 < grace_ms + 10_000 + 5_000 {
                errors.push(format!(
                    "{who}: terminationGracePeriodSeconds {term} is shorter than the drain \
                     ({grace_ms} ms grace + 10 s drain + 5 s margin)"
                ));
            }
            if role == Role::Approval {
                check_runner_url(&who, settings.get("runner"), docs, &mut errors);
            }
            pods.push(Pod {
                owner: owner.clone(),
                labels: &tpl["metadata"]["labels"],
                ports,
                grpc: listen,
                metrics,
                arbor: true,
                replicas,
            });
        }
    }
    if seen_roles.len() != 2 {
        errors.push(format!(
            "expected runner-svc and approval-svc workloads, found {seen_roles:?}"
        ));
    }

    let resolve = |pod: &Pod<'_>, target: &Value| -> Option<i64> {
        match target {
            Value::String(name) => pod.ports.get(name).copied(),
            Value::Number(n) => n.as_i64().filter(|n| pod.ports.values().any(|p| p == n)),
            _ => None,
        }
    };
    for svc in by_kind("Service") {
        let owner = name_of(svc);
        let selected: Vec<&Pod<'_>> = pods
            .iter()
            .filter(|p| labels_match(&svc["spec"]["selector"], p.labels))
            .collect();
        if selected.is_empty() {
            errors.push(format!("{owner}: selects no pod"));
            continue;
        }
        for port in svc["spec"]["ports"].as_array().into_iter().flatten() {
            let pname = port["name"].as_str().unwrap_or("");
            let target = if port["targetPort"].is_null() {
                &port["port"]
            } else {
                &port["targetPort"]
            };
            for pod in &selected {
                let Some(number) = resolve(pod, target) else {
                    errors.push(format!(
                        "{owner}: port {pname:?} targets {target}, not a port of {}",
                        pod.owner
                    ));
                    continue;
                };
                if !pod.arbor {
                    continue;
                }
                if Some(number) == pod.grpc {
                    if !(pname == "grpc" || pname.starts_with("grpc-")) {
                        errors.push(format!(
                            "{owner}: the gRPC port must be named `grpc` or `grpc-*` (mesh protocol selection), not {pname:?}"
                        ));
                    }
                    if port["appProtocol"] != "grpc" {
                        errors.push(format!("{owner}: port {pname:?} needs appProtocol: grpc"));
                    }
                } else if Some(number) == pod.metrics {
                    if !(pname.starts_with("http") || pname == "metrics") {
                        errors.push(format!(
                            "{owner}: the metrics port must be named `http-*`, not {pname:?}"
                        ));
                    }
                } else {
                    errors.push(format!(
                        "{owner}: port {pname:?} targets {number}, neither gRPC nor metrics"
                    ));
                }
            }
        }
    }

    for np in by_kind("NetworkPolicy") {
        let owner = name_of(np);
        let selected: Vec<&Pod<'_>> = pods
            .iter()
            .filter(|p| labels_match(&np["spec"]["podSelector"]["matchLabels"], p.labels))
            .collect();
        if selected.is_empty() {
            errors.push(format!("{owner}: selects no pod"));
        }
        for rule in np["spec"]["ingress"].as_array().into_iter().flatten() {
            for port in rule["ports"].as_array().into_iter().flatten() {
                for pod in &selected {
                    if resolve(pod, &port["port"]).is_none() {
                        errors.push(format!(
                            "{owner}: port {} is not a port of {}",
                            port["port"], pod.owner
                        ));
                    }
                }
            }
        }
    }
    // Only approval-svc may reach the runner's gRPC port.
    if let Some(runner) = pods.iter().find(|p| p.owner.contains("runner")) {
        let grpc_rules: Vec<Value> = by_kind("NetworkPolicy")
            .into_iter()
            .filter(|np| labels_match(&np["spec"]["podSelector"]["matchLabels"], runner.labels))
            .flat_map(|np| {
                np["spec"]["ingress"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
            })
            .filter(|rule| {
                rule["ports"].as_array().is_none_or(|ports| {
                    ports
                        .iter()
                        .any(|p| resolve(runner, &p["port"]) == runner.grpc)
                })
            })
            .collect();
        if grpc_rules.is_empty() {
            errors.push("no NetworkPolicy rule admits anyone to the runner's gRPC port".into());
        }
        for rule in &grpc_rules {
            let froms = rule["from"].as_array().cloned().unwrap_or_default();
            let only_approval = !froms.is_empty()
                && froms.iter().all(|f| {
                    f["namespaceSelector"].is_null()
                        && f["ipBlock"].is_null()
                        && pods.iter().any(|p| {
                            p.owner.contains("approval")
                                && labels_match(&f["podSelector"]["matchLabels"], p.labels)
                        })
                });
            if !only_approval {
                errors.push(format!(
                    "runner gRPC port is open to more than approval-svc: {rule}"
                ));
            }
        }
    }

    for pdb in by_kind("PodDisruptionBudget") {
        let selected: BTreeMap<&str, i64> = pods
            .iter()
            .filter(|p| labels_match(&pdb["spec"]["selector"]["matchLabels"], p.labels))
            .map(|p| (p.owner.as_str(), p.replicas))
            .collect();
        if selected.is_empty() {
            errors.push(format!("{}: selects no pod", name_of(pdb)));
        }
        // A budget no eviction can meet blocks every node drain.
        let replicas: i64 = selected.values().sum();
        let min = pdb["spec"]["minAvailable"].as_i64();
        if min.is_some_and(|m| m >= replicas) || pdb["spec"]["maxUnavailable"] == 0 {
            errors.push(format!(
                "{}: with {replicas} pods selected, no pod may ever be evicted",
                name_of(pdb)
            ));
        }
    }
    if by_kind("PodDisruptionBudget").is_empty() {
        errors.push("no PodDisruptionBudget".into());
    }
    errors.extend(check_istio(docs, &pods));
    errors
}

fn check_mounted_file(
    who: &str,
    flag: &str,
    path: &str,
    mounts: &[(String, String)],
    volumes: &BTreeMap<String, &Value>,
    docs: &[Value],
    errors: &mut Vec<String>,
) {
    let Some((vol, mount)) = mounts
        .iter()
        .find(|(_, m)| path.starts_with(&format!("{m}/")))
    else {
        errors.push(format!("--{flag} {path}: not inside any volumeMount"));
        return;
    };
    let file = &path[mount.len() + 1..];
    let Some(volume) = volumes.get(vol) else {
        errors.push(format!("{who}: --{flag}: volume {vol} is not defined"));
        return;
    };
    let (kind, source, name_key) = if !volume["configMap"].is_null() {
        ("ConfigMap", &volume["configMap"], "name")
    } else if !volume["secret"].is_null() {
        ("Secret", &volume["secret"], "secretName")
    } else {
        errors.push(format!(
            "{who}: --{flag}: volume {vol} is neither a ConfigMap nor a Secret"
        ));
        return;
    };
    let object = source[name_key].as_str().unwrap_or("");
    // With `items` only the listed keys appear, at their `path`.
    let key = match source["items"].as_array() {
        Some(items) => match items.iter().find(|i| i["path"] == file) {
            Some(item) => item["key"].as_str().unwrap_or("").to_string(),
            None => {
                errors.push(format!(
                    "{who}: --{flag} {path}: no item of volume {vol} is mounted as {file}"
                ));
                return;
            }
        },
        None => file.to_string(),
    };
    let found = docs.iter().any(|d| {
        d["kind"] == kind
            && d["metadata"]["name"] == object
            && ["data", "stringData", "binaryData"]
                .iter()
                .any(|f| !d[*f][&key].is_null())
    });
    if !found {
        errors.push(format!(
            "{who}: --{flag} {path}: {kind} {object} has no key {key}"
        ));
    }
}

fn check_runner_url(who: &str, url: Option<&str>, docs: &[Value], errors: &mut Vec<String>) {
    let Some(url) = url else {
        errors.push(format!("{who}: no --runner"));
        return;
    };
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, p.trim_end_matches('/').parse::<i64>().ok()),
        None => (rest, None),
    };
    let svc_name = host.split('.').next().unwrap_or(host);
    let ok = docs.iter().any(|d| {
        d["kind"] == "Service"
            && d["metadata"]["name"] == svc_name
            && d["spec"]["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["name"] == "grpc" && p["port"].as_i64() == port)
    });
    if !ok {
        errors.push(format!(
            "{who}: --runner {url} is not a Service's `grpc` port"
        ));
    }
}

fn check_istio(docs: &[Value], pods: &[Pod<'_>]) -> Vec<String> {
    let mut errors = Vec::new();
    for d in docs {
        let api = d["apiVersion"].as_str().unwrap_or("");
        if !api.contains("istio.io") {
            continue;
        }
        let owner = name_of(d);
        if d["metadata"]["name"].as_str().is_none_or(str::is_empty) {
            errors.push(format!("{owner}: metadata.name is required"));
        }
        let spec = &d["spec"];
        match (api, d["kind"].as_str().unwrap_or("")) {
            ("networking.istio.io/v1" | "networking.istio.io/v1beta1", "DestinationRule") => {
                let host = spec["host"].as_str().unwrap_or("");
                let svc = host.split('.').next().unwrap_or("");
                if host.is_empty() {
                    errors.push(format!("{owner}: spec.host is required"));
                } else if !docs
                    .iter()
                    .any(|s| s["kind"] == "Service" && s["metadata"]["name"] == svc)
                {
                    errors.push(format!("{owner}: host {host} is not a Service here"));
                }
                let mode = &spec["trafficPolicy"]["tls"]["mode"];
                if !mode.is_null()
                    && !["DISABLE", "SIMPLE", "MUTUAL", "ISTIO_MUTUAL"]
                        .iter()
                        .any(|m| mode == m)
                {
                    errors.push(format!("{owner}: unknown tls mode {mode}"));
                }
            }
            ("security.istio.io/v1" | "security.istio.io/v1beta1", "AuthorizationPolicy") => {
                let action = spec["action"].as_str().unwrap_or("ALLOW");
                if !["ALLOW", "DENY", "AUDIT", "CUSTOM"].contains(&action) {
                    errors.push(format!("{owner}: unknown action {action}"));
                }
                let selected: Vec<&Pod<'_>> = pods
                    .iter()
                    .filter(|p| labels_match(&spec["selector"]["matchLabels"], p.labels))
                    .collect();
                if selected.is_empty() {
                    errors.push(format!("{owner}: selector matches no workload"));
                }
                for rule in spec["rules"].as_array().into_iter().flatten() {
                    for to in rule["to"].as_array().into_iter().flatten() {
                        for port in str_list(&to["operation"]["ports"]) {
                            let n: Option<i64> = port.parse().ok();
                            for pod in &selected {
                                if !pod.ports.values().any(|p| Some(*p) == n) {
                                    errors.push(format!(
                                        "{owner}: port {port} is not a port of {}",
                                        pod.owner
                                    ));
                                }
                            }
                        }
                    }
                }
            }
            ("security.istio.io/v1" | "security.istio.io/v1beta1", "PeerAuthentication") => {
                let mode = &spec["mtls"]["mode"];
                if !["UNSET", "DISABLE", "PERMISSIVE", "STRICT"]
                    .iter()
                    .any(|m| mode == m)
                {
                    errors.push(format!(
                        "{owner}: spec.mtls.mode must be UNSET|DISABLE|PERMISSIVE|STRICT"
                    ));
                }
            }
            (api, kind) => errors.push(format!("{owner}: unexpected Istio resource {api} {kind}")),
        }
    }
    errors
}

/// Checks a compose file's services against the binaries.
pub fn check_compose(doc: &Value, bins: &Binaries) -> Vec<String> {
    let mut errors = Vec::new();
    let services = doc["services"].as_object().cloned().unwrap_or_default();
    for (name, svc) in &services {
        let who = format!("compose service {name}");
        let Some((help, role)) = bins.for_name(name) else {
            if postgres::is_database(svc) {
                postgres::check_compose_database(&who, svc, &mut errors);
            } else {
                errors.push(format!("{who}: not an Arbor service"));
            }
            continue;
        };
        let env: Vec<(String, String)> = svc["environment"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
            .collect();
        let s = check_invocation(&who, help, &str_list(&svc["command"]), &env, &mut errors);
        let store = s.get("store");
        if let Some(url) = store {
            postgres::check_compose_store(&who, url, svc, &services, &mut errors);
        }
        postgres::check_compose_replicas(
            &who,
            svc,
            store.is_some(),
            s.get("data-dir"),
            &mut errors,
        );
        let published: Vec<i64> = str_list(&svc["ports"])
            .iter()
            .filter_map(|p| p.rsplit(':').next()?.parse().ok())
            .collect();
        for flag in ["listen", "metrics-listen"] {
            match s.get(flag).and_then(port_of) {
                Some(p) if published.contains(&p) => {}
                p => errors.push(format!(
                    "{who}: --{flag} port {p:?} is not published ({published:?})"
                )),
            }
        }
        if role == Role::Approval {
            let url = s.get("runner").unwrap_or("");
            let target = url.trim_start_matches("http://");
            let ok = target.rsplit_once(':').is_some_and(|(host, port)| {
                services.get(host).is_some_and(|r| {
                    str_list(&r["command"])
                        .iter()
                        .any(|a| a.strip_prefix("--listen=").and_then(port_of) == port.parse().ok())
                })
            });
            if !ok {
                errors.push(format!(
                    "{who}: --runner {url} is not the runner service's listen port"
                ));
            }
        }
    }
    errors
}

/// Checks a Dockerfile against the binary it packages.
pub fn check_dockerfile(text: &str, bin: &str, crate_name: &str, help: &Help) -> Vec<String> {
    let mut errors = Vec::new();
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let joined = text.replace("\\\n", " ");
    let stages = lines.iter().filter(|l| l.starts_with("FROM ")).count();
    if stages < 2 {
        errors.push(format!("{bin}: not a multi-stage build ({stages} FROM)"));
    }
    let last_from = lines
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .unwrap_or(0);
    let user = lines[last_from..]
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "));
    match user {
        Some(u) if u.trim() != "root" && u.trim() != "0" => {}
        other => errors.push(format!(
            "{bin}: the runtime stage must run as a non-root USER, got {other:?}"
        )),
    }
    if !joined.contains(&format!("-p {crate_name}")) || !joined.contains(&format!("--bin {bin}")) {
        errors.push(format!(
            "{bin}: the build stage does not build -p {crate_name} --bin {bin}"
        ));
    }
    if !joined.contains(&format!("ENTRYPOINT [\"/usr/local/bin/{bin}\"]")) {
        errors.push(format!("{bin}: ENTRYPOINT is not the {bin} binary"));
    }
    let mut env: BTreeMap<String, String> = BTreeMap::new();
    for line in joined.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("ENV ") {
            for pair in rest.split_whitespace() {
                if let Some((k, v)) = pair.split_once('=') {
                    env.insert(k.to_string(), v.to_string());
                }
            }
        }
    }
    for k in env.keys() {
        if k != "RUST_LOG" && !help.env.contains(k) {
            errors.push(format!("{bin}: ENV {k} is not read by the binary"));
        }
    }
    let exposed: BTreeSet<i64> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("EXPOSE "))
        .flat_map(|l| {
            l.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<_>>()
        })
        .collect();
    for var in ["ARBOR_LISTEN", "ARBOR_METRICS_LISTEN"] {
        match env.get(var).and_then(|a| port_of(a)) {
            Some(p) if exposed.contains(&p) => {}
            p => errors.push(format!(
                "{bin}: {var} port {p:?} is not EXPOSEd ({exposed:?})"
            )),
        }
    }
    errors
}
