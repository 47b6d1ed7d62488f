//! `deploy/` is checked without a cluster or a Docker engine:
//! - the kustomizations (base, overlays/istio, overlays/postgres) render with `kubectl kustomize`
//!   (kustomize v5, part of the machine image) and every Kubernetes document validates against
//!   the official JSON schemas (`kubernetes-validate --strict`, installed from PyPI into target/
//!   on first use); Istio resources are checked for apiVersion/kind, required fields and
//!   references;
//! - flags, env names, ports, probe ports, Service port names, mounted files, drain timing and
//!   the store match what the real binaries accept (`serve --help`), and the example policy and
//!   tokens parse;
//! - the PostgreSQL overlay runs both services as stateless Deployments of 3 replicas, with
//!   ARBOR_STORE from a Secret of the render, no PVC, and a bundled dev database that matches;
//! - the Dockerfiles pass hadolint (from PyPI) and both compose files match the binaries;
//! - broken copies (wrong port name, probe on the wrong port, unknown flag, store from a missing
//!   Secret, …) are caught.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::{path::Path, process::Command, sync::OnceLock};

use arbor_tests::{
    Binaries, Profile,
    deploy::{self, Help},
    process::workspace_root,
    tools::{python_venv, run},
};
use serde_json::{Value, json};

const K8S_VERSION: &str = "1.32.0";

fn bins() -> &'static deploy::Binaries {
    static HELP: OnceLock<deploy::Binaries> = OnceLock::new();
    HELP.get_or_init(|| {
        let bins = Binaries::get(Profile::Debug);
        let help = |bin: &Path| {
            Help::parse(&run(
                Command::new(bin).args(["serve", "--help"]),
                "reading serve --help",
            ))
        };
        let b = deploy::Binaries {
            runner: help(&bins.runner),
            approval: help(&bins.approval),
        };
        for h in [&b.runner, &b.approval] {
            assert!(h.flags.contains_key("listen") && h.flags.contains_key("metrics-listen"));
            assert!(h.env.contains("ARBOR_LISTEN") && h.env.contains("ARBOR_DRAIN_GRACE_MS"));
        }
        b
    })
}

fn deploy_venv() -> std::path::PathBuf {
    python_venv(
        "py-venv-deploy",
        &workspace_root().join("deploy/requirements.txt"),
    )
}

fn yaml_docs(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| !v.is_null())
        .collect()
}

fn render(dir: &str) -> Vec<Value> {
    let out = run(
        Command::new("kubectl")
            .arg("kustomize")
            .arg(workspace_root().join(dir)),
        "rendering with `kubectl kustomize` (kubectl ships kustomize v5)",
    );
    yaml_docs(&out)
}

/// Validates every non-Istio document against the Kubernetes schemas; `Err` has the report.
fn validate_schemas(docs: &[Value]) -> Result<(), String> {
    let venv = deploy_venv();
    let tool = venv.parent().unwrap().join("kubernetes-validate");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rendered.yaml");
    let text: Vec<String> = docs
        .iter()
        .filter(|d| !d["apiVersion"].as_str().unwrap_or("").contains("istio.io"))
        .map(|d| serde_yaml_ng::to_string(d).unwrap())
        .collect();
    std::fs::write(&file, text.join("---\n")).unwrap();
    let out = Command::new(tool)
        .args(["--strict", "--quiet", "-k", K8S_VERSION])
        .arg(&file)
        .output()
        .expect("kubernetes-validate runs");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && !report.contains("ERROR") {
        Ok(())
    } else {
        Err(report)
    }
}

fn kinds(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap_or("").to_string())
        .collect()
}

fn find<'a>(docs: &'a mut [Value], kind: &str, name: &str) -> &'a mut Value {
    docs.iter_mut()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

fn get<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind}/{name}"))
}

/// The env entry `name` of a container.
fn env_mut<'a>(container: &'a mut Value, name: &str) -> &'a mut Value {
    container["env"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|e| e["name"] == name)
        .unwrap_or_else(|| panic!("no env {name}"))
}

/// The first container of a workload's pod template.
fn container_mut<'a>(docs: &'a mut [Value], kind: &str, name: &str) -> &'a mut Value {
    &mut find(docs, kind, name)["spec"]["template"]["spec"]["containers"][0]
}

const POSTGRES: &str = "deploy/k8s/overlays/postgres";

#[test]
fn base_and_overlays_render_validate_and_match_the_binaries() {
    for dir in ["deploy/k8s/base", "deploy/k8s/overlays/istio", POSTGRES] {
        let docs = render(dir);
        let kinds = kinds(&docs);
        for kind in [
            "StatefulSet",
            "Service",
            "ConfigMap",
            "Secret",
            "PodDisruptionBudget",
            "NetworkPolicy",
        ] {
            assert!(kinds.iter().any(|k| k == kind), "{dir}: no {kind}");
        }
        if let Err(report) = validate_schemas(&docs) {
            panic!("{dir} does not validate against Kubernetes {K8S_VERSION}:\n{report}");
        }
        let errors = deploy::check_manifests(&docs, bins());
        assert!(errors.is_empty(), "{dir}:\n{}", errors.join("\n"));
    }
    let istio = kinds(&render("deploy/k8s/overlays/istio"));
    for kind in [
        "DestinationRule",
        "AuthorizationPolicy",
        "PeerAuthentication",
    ] {
        assert!(istio.iter().any(|k| k == kind), "istio overlay: no {kind}");
    }
}

#[test]
fn postgres_overlay_runs_stateless_replicas_on_a_store_from_a_secret() {
    let docs = render(POSTGRES);
    for name in ["runner-svc", "approval-svc"] {
        assert!(
            !docs
                .iter()
                .any(|d| d["kind"] == "StatefulSet" && d["metadata"]["name"] == name),
            "{name} is still a StatefulSet"
        );
        let spec = &get(&docs, "Deployment", name)["spec"];
        assert_eq!(spec["replicas"], 3, "{name}");
        assert!(spec["volumeClaimTemplates"].is_null(), "{name}");
        let pod = &spec["template"]["spec"];
        let volumes = pod["volumes"].as_array().unwrap();
        assert!(
            volumes
                .iter()
                .all(|v| v["persistentVolumeClaim"].is_null() && v["ephemeral"].is_null()),
            "{name} has a volume that holds state: {volumes:?}"
        );
        let c = &pod["containers"][0];
        for mount in c["volumeMounts"].as_array().unwrap() {
            assert!(
                volumes.iter().any(|v| v["name"] == mount["name"]),
                "{name} mounts {mount}, which is no volume of its pod"
            );
        }
        assert!(
            !c["args"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a.as_str().unwrap().starts_with("--data-dir")),
            "{name} still has a --data-dir"
        );
        let store = c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "ARBOR_STORE")
            .unwrap_or_else(|| panic!("{name}: no ARBOR_STORE"));
        assert!(store["value"].is_null(), "{name}: ARBOR_STORE is a literal");
        let from = &store["valueFrom"]["secretKeyRef"];
        let secret = get(&docs, "Secret", from["name"].as_str().unwrap());
        let url = secret["stringData"][from["key"].as_str().unwrap()]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: the Secret has no key {}", from["key"]));
        assert!(url.starts_with("postgres://"), "{url}");
        let budget = get(&docs, "PodDisruptionBudget", name);
        assert_eq!(
            budget["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
            name
        );
        assert_eq!(
            budget["spec"]["minAvailable"], 2,
            "{name}: two of three stay up"
        );
    }
    // The base's headless Services and its budget over both single pods are gone.
    for (kind, gone) in [
        ("Service", "runner-svc-headless"),
        ("Service", "approval-svc-headless"),
        ("PodDisruptionBudget", "arbor"),
    ] {
        assert!(
            !docs
                .iter()
                .any(|d| d["kind"] == kind && d["metadata"]["name"] == gone),
            "{kind}/{gone} is left over"
        );
    }

    let db = &get(&docs, "StatefulSet", "postgres")["spec"];
    let c = &db["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "postgres:16");
    assert_eq!(db["replicas"], 1);
    assert!(
        db["volumeClaimTemplates"]
            .as_array()
            .is_some_and(|t| !t.is_empty())
    );
    assert_eq!(c["readinessProbe"]["exec"]["command"][0], "pg_isready");
    assert_eq!(
        get(&docs, "Service", "postgres")["spec"]["clusterIP"],
        "None"
    );
}

#[test]
fn example_policy_and_tokens_parse_and_the_runner_token_is_a_service_principal() {
    let docs = render("deploy/k8s/base");
    let policy = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap")
        .map(|d| d["data"]["policy.toml"].as_str().unwrap().to_string())
        .unwrap();
    arbor_approval_svc::policy::Policy::from_toml(&policy).expect("the example policy parses");
    let secret = docs.iter().find(|d| d["kind"] == "Secret").unwrap();
    let data = &secret["stringData"];
    for key in ["runner-tokens.toml", "approval-tokens.toml"] {
        arbor_shared::auth::Authenticator::from_toml(data[key].as_str().unwrap())
            .unwrap_or_else(|e| panic!("{key}: {e}"));
    }
    let token = data["runner-token"].as_str().unwrap();
    let hash = run(
        Command::new(Binaries::get(Profile::Debug).runner).args(["hash-token", token]),
        "hashing the runner token",
    );
    let runner_tokens: toml::Value =
        toml::from_str(data["runner-tokens.toml"].as_str().unwrap()).unwrap();
    let service = runner_tokens["principal"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["token_sha256"].as_str() == Some(hash.trim()))
        .expect("approval-svc's runner token is one of the runner's principals");
    assert!(
        service["roles"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r.as_str() == Some("service")),
        "approval-svc's principal on the runner needs the `service` role"
    );
}

type Mutation = (&'static str, &'static str, fn(&mut Vec<Value>));

/// Applies each mutation to a copy of `good`; the checker must report it by `expect`.
fn assert_caught(dir: &str, good: &[Value], mutations: Vec<Mutation>) {
    assert!(deploy::check_manifests(good, bins()).is_empty(), "{dir}");
    for (what, expect, mutate) in mutations {
        let mut docs = good.to_vec();
        mutate(&mut docs);
        let errors = deploy::check_manifests(&docs, bins());
        assert!(
            errors.iter().any(|e| e.contains(expect)),
            "{dir}: {what}: expected an error containing {expect:?}, got {errors:#?}"
        );
    }
}

/// Each broken copy must be reported with a message naming the problem.
#[test]
fn the_checker_catches_broken_manifests() {
    let good = render("deploy/k8s/base");
    let mutations: Vec<Mutation> = vec![
        ("service gRPC port renamed", "must be named `grpc`", |d| {
            find(d, "Service", "runner-svc")["spec"]["ports"][0]["name"] = json!("http");
        }),
        (
            "readiness probe on the metrics port",
            "readinessProbe checks port 9464",
            |d| {
                find(d, "StatefulSet", "runner-svc")["spec"]["template"]["spec"]["containers"][0]
                    ["readinessProbe"]["grpc"]["port"] = json!(9464);
            },
        ),
        (
            "liveness probe on a port nobody serves",
            "livenessProbe checks port 8080",
            |d| {
                find(d, "StatefulSet", "approval-svc")["spec"]["template"]["spec"]["containers"]
                    [0]["livenessProbe"]["grpc"]["port"] = json!(8080);
            },
        ),
        ("container port renamed", "container port `grpc`", |d| {
            find(d, "StatefulSet", "approval-svc")["spec"]["template"]["spec"]["containers"][0]["ports"]
                [0]["name"] = json!("rpc");
        }),
        ("unknown flag", "no flag --listen-address", |d| {
            let c = &mut find(d, "StatefulSet", "runner-svc")["spec"]["template"]["spec"]["containers"]
                [0];
            c["args"]
                .as_array_mut()
                .unwrap()
                .push(json!("--listen-address=0.0.0.0:1"));
        }),
        ("env name typo", "env ARBOR_WORKER is not read", |d| {
            let c = &mut find(d, "StatefulSet", "runner-svc")["spec"]["template"]["spec"]["containers"]
                [0];
            c["env"][1]["name"] = json!("ARBOR_WORKER");
        }),
        (
            "grace shorter than the drain",
            "terminationGracePeriodSeconds 10",
            |d| {
                find(d, "StatefulSet", "runner-svc")["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] =
                    json!(10);
            },
        ),
        ("policy file not mounted", "no item of volume policy", |d| {
            let c = &mut find(d, "StatefulSet", "approval-svc")["spec"]["template"]["spec"]["containers"]
                [0];
            for a in c["args"].as_array_mut().unwrap() {
                if a.as_str().is_some_and(|s| s.starts_with("--policy=")) {
                    *a = json!("--policy=/etc/arbor/policy/rules.toml");
                }
            }
        }),
        (
            "runner gRPC open to a namespace",
            "open to more than approval-svc",
            |d| {
                find(d, "NetworkPolicy", "runner-svc")["spec"]["ingress"][0]["from"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"namespaceSelector": {}}));
            },
        ),
        ("two sled replicas", "2 replicas of a sled store", |d| {
            find(d, "StatefulSet", "runner-svc")["spec"]["replicas"] = json!(2);
        }),
    ];
    assert_caught("deploy/k8s/base", &good, mutations);

    // The schema validation is not a formality either.
    let mut docs = good.clone();
    find(&mut docs, "StatefulSet", "runner-svc")["spec"]["replicas"] = json!("one");
    assert!(validate_schemas(&docs).is_err(), "replicas: \"one\" passed");
    let mut docs = good;
    find(&mut docs, "Service", "runner-svc")["spec"]["ports"][0]["appProtocl"] = json!("grpc");
    assert!(
        validate_schemas(&docs).is_err(),
        "an unknown field passed --strict"
    );
}

#[test]
fn the_checker_catches_broken_postgres_manifests() {
    let good = render(POSTGRES);
    let mutations: Vec<Mutation> = vec![
        (
            "ARBOR_STORE from a missing Secret",
            "env ARBOR_STORE comes from Secret arbor-db, which is not in the render",
            |d| {
                let c = container_mut(d, "Deployment", "runner-svc");
                env_mut(c, "ARBOR_STORE")["valueFrom"]["secretKeyRef"]["name"] = json!("arbor-db");
            },
        ),
        (
            "ARBOR_STORE from a missing key",
            "Secret arbor-postgres has no key uri",
            |d| {
                let c = container_mut(d, "Deployment", "approval-svc");
                env_mut(c, "ARBOR_STORE")["valueFrom"]["secretKeyRef"]["key"] = json!("uri");
            },
        ),
        ("the store URL as a literal", "not as a literal", |d| {
            let c = container_mut(d, "Deployment", "runner-svc");
            *env_mut(c, "ARBOR_STORE") = json!({
                "name": "ARBOR_STORE",
                "value": "postgres://arbor:example-dev-password@postgres:5432/arbor"
            });
        }),
        (
            "a PVC mounted into a replica",
            "replicas must be stateless",
            |d| {
                let pod = &mut find(d, "Deployment", "runner-svc")["spec"]["template"]["spec"];
                pod["volumes"].as_array_mut().unwrap().push(json!({
                    "name": "data", "persistentVolumeClaim": {"claimName": "runner-data"}
                }));
                pod["containers"][0]["volumeMounts"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"name": "data", "mountPath": "/var/lib/arbor/data"}));
            },
        ),
        (
            "three replicas on sled",
            "3 replicas of a sled store",
            |d| {
                let c = container_mut(d, "Deployment", "approval-svc");
                c["env"]
                    .as_array_mut()
                    .unwrap()
                    .retain(|e| e["name"] != "ARBOR_STORE");
            },
        ),
        (
            "the store URL on the wrong port",
            "ARBOR_STORE port 5433 is not a port of Service postgres",
            |d| {
                find(d, "Secret", "arbor-postgres")["stringData"]["url"] =
                    json!("postgres://arbor:example-dev-password@postgres:5433/arbor");
            },
        ),
        (
            "the store URL with another password",
            "the store URL's password is not StatefulSet/postgres's POSTGRES_PASSWORD",
            |d| {
                find(d, "Secret", "arbor-postgres")["stringData"]["url"] =
                    json!("postgres://arbor:hunter2@postgres:5432/arbor");
            },
        ),
        (
            "the store URL's host is no Service",
            "ARBOR_STORE host pg is not a Service here",
            |d| {
                find(d, "Secret", "arbor-postgres")["stringData"]["url"] =
                    json!("postgres://arbor:example-dev-password@pg:5432/arbor");
            },
        ),
        (
            "a budget keeping all three",
            "with 3 pods selected, no pod may ever be evicted",
            |d| {
                find(d, "PodDisruptionBudget", "runner-svc")["spec"]["minAvailable"] = json!(3);
            },
        ),
        (
            "the database's data off its PVC",
            "PGDATA /pgdata is not on a PVC",
            |d| {
                let c = container_mut(d, "StatefulSet", "postgres");
                env_mut(c, "PGDATA")["value"] = json!("/pgdata");
            },
        ),
        (
            "the database ready without pg_isready",
            "must run pg_isready",
            |d| {
                let c = container_mut(d, "StatefulSet", "postgres");
                c["readinessProbe"] = json!({"tcpSocket": {"port": 5432}});
            },
        ),
        (
            "two dev databases",
            "2 replicas of the bundled PostgreSQL",
            |d| {
                find(d, "StatefulSet", "postgres")["spec"]["replicas"] = json!(2);
            },
        ),
    ];
    assert_caught(POSTGRES, &good, mutations);

    // A Deployment cannot have claim templates: a half-done conversion fails the schema.
    let mut docs = good;
    find(&mut docs, "Deployment", "runner-svc")["spec"]["volumeClaimTemplates"] = json!([]);
    assert!(
        validate_schemas(&docs).is_err(),
        "volumeClaimTemplates on a Deployment passed --strict"
    );
}

#[test]
fn istio_resources_are_checked_for_shape_and_references() {
    let good = render("deploy/k8s/overlays/istio");
    let mut docs = good.clone();
    find(&mut docs, "DestinationRule", "runner-svc")["spec"]["host"] =
        json!("runner.arbor.svc.cluster.local");
    let errors = deploy::check_manifests(&docs, bins());
    assert!(
        errors.iter().any(|e| e.contains("is not a Service")),
        "{errors:#?}"
    );
    let mut docs = good.clone();
    find(&mut docs, "AuthorizationPolicy", "runner-svc")["spec"]["rules"][0]["to"][0]["operation"]
        ["ports"] = json!(["50052"]);
    let errors = deploy::check_manifests(&docs, bins());
    assert!(
        errors
            .iter()
            .any(|e| e.contains("port 50052 is not a port")),
        "{errors:#?}"
    );
    let mut docs = good;
    find(&mut docs, "PeerAuthentication", "arbor")["spec"]["mtls"]["mode"] = json!("ON");
    let errors = deploy::check_manifests(&docs, bins());
    assert!(
        errors.iter().any(|e| e.contains("spec.mtls.mode")),
        "{errors:#?}"
    );
}

#[test]
fn dockerfiles_pass_hadolint_and_match_the_binaries() {
    let venv = deploy_venv();
    let hadolint = venv.parent().unwrap().join("hadolint");
    let root = workspace_root();
    let targets = [
        ("runner", "runner-svc", "arbor-runner-svc", &bins().runner),
        (
            "approval",
            "approval-svc",
            "arbor-approval-svc",
            &bins().approval,
        ),
    ];
    for (file, bin, crate_name, help) in targets {
        let path = root.join(format!("deploy/docker/{file}.Dockerfile"));
        run(Command::new(&hadolint).arg(&path), "hadolint");
        let text = std::fs::read_to_string(&path).unwrap();
        let errors = deploy::check_dockerfile(&text, bin, crate_name, help);
        assert!(
            errors.is_empty(),
            "{}:\n{}",
            path.display(),
            errors.join("\n")
        );

        let as_root = text.replace("USER 10001", "USER root");
        assert!(!deploy::check_dockerfile(&as_root, bin, crate_name, help).is_empty());
        let wrong_port = text.replace("EXPOSE ", "EXPOSE 8080 #");
        let errors = deploy::check_dockerfile(&wrong_port, bin, crate_name, help);
        assert!(
            errors.iter().any(|e| e.contains("is not EXPOSEd")),
            "{errors:#?}"
        );
    }
}

#[test]
fn compose_file_matches_the_binaries() {
    let text = std::fs::read_to_string(workspace_root().join("deploy/compose.yaml")).unwrap();
    let doc = yaml_docs(&text).remove(0);
    let errors = deploy::check_compose(&doc, bins());
    assert!(errors.is_empty(), "{}", errors.join("\n"));

    let broken = text.replace(
        "--runner=http://runner:50051",
        "--runner=http://runner:50061",
    );
    let errors = deploy::check_compose(&yaml_docs(&broken).remove(0), bins());
    assert!(errors.iter().any(|e| e.contains("--runner")), "{errors:#?}");
    let broken = text.replace("--drain-grace-ms=1000", "--drain-grace=1000");
    let errors = deploy::check_compose(&yaml_docs(&broken).remove(0), bins());
    assert!(
        errors.iter().any(|e| e.contains("no flag --drain-grace")),
        "{errors:#?}"
    );
    let broken = text.replace(
        "    stop_grace_period: 30s\n  approval:",
        "    deploy:\n      replicas: 2\n    stop_grace_period: 30s\n  approval:",
    );
    let errors = deploy::check_compose(&yaml_docs(&broken).remove(0), bins());
    assert!(
        errors
            .iter()
            .any(|e| e.contains("2 replicas of a sled store")),
        "{errors:#?}"
    );

    // The PostgreSQL shape: replicas on one database that they wait for.
    let text =
        std::fs::read_to_string(workspace_root().join("deploy/compose.postgres.yaml")).unwrap();
    let errors = deploy::check_compose(&yaml_docs(&text).remove(0), bins());
    assert!(errors.is_empty(), "{}", errors.join("\n"));
    let url = "--store=postgres://arbor:example-dev-password@postgres:5432/arbor";
    let cases = [
        (
            text.replacen(url, "--store=postgres://arbor:other@postgres:5432/arbor", 1),
            "the store URL's password is not postgres's POSTGRES_PASSWORD",
        ),
        (
            text.replace(
                url,
                "--store=postgres://arbor:example-dev-password@db:5432/arbor",
            ),
            "--store host db is not a PostgreSQL service",
        ),
        (
            text.replace("127.0.0.1:50061-50062:50051", "127.0.0.1:50061:50051"),
            "has 1 host port(s) for 2 replicas",
        ),
        (
            text.replacen(
                "condition: service_healthy",
                "condition: service_started",
                1,
            ),
            "must depend on postgres with condition: service_healthy",
        ),
        (
            text.replace("\"pg_isready\", ", ""),
            "needs a healthcheck with pg_isready",
        ),
    ];
    for (broken, expect) in cases {
        let errors = deploy::check_compose(&yaml_docs(&broken).remove(0), bins());
        assert!(
            errors.iter().any(|e| e.contains(expect)),
            "expected {expect:?}, got {errors:#?}"
        );
    }
}
