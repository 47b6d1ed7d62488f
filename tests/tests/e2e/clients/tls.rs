//! Both packages connect over TLS with the CA given, and a plaintext client of either gets an
//! UNAVAILABLE error, not an answer.

use super::*;
use arbor_tests::{
    Binaries, Profile, Service, ServiceKind,
    tools::{node_client, python_client},
};

const PYTHON: &str = r#"
import os, sys
from arbor_client import Client, Tls
from arbor_client.errors import Unavailable
address, ca, tree = sys.argv[1], sys.argv[2], sys.argv[3]
with Client(address, None, tls=Tls.from_files(ca=ca), timeout=10) as arbor:
    print("registered", arbor.register_tree(tree).id)
with Client(address, None, timeout=2) as plain:
    try:
        plain.get_run("x")
    except Unavailable:
        print("plaintext refused")
"#;

const NODE: &str = r#"
const { readFileSync } = require('node:fs');
const { ArborClient } = require('arbor-client');
const [address, ca, tree] = process.argv.slice(1);
(async () => {
  const arbor = new ArborClient({ runner: address }, { tls: { ca: readFileSync(ca) }, timeoutMs: 10000 });
  console.log('registered', (await arbor.registerTree(tree)).id);
  arbor.close();
  const plain = new ArborClient({ runner: address }, { timeoutMs: 2000 });
  await plain.getRun('x').catch((e) => { if (e.codeName === 'UNAVAILABLE') console.log('plaintext refused'); });
  plain.close();
})();
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_packages_connect_over_tls_with_the_ca_given() {
    let (python, modules) = (python_client(), node_client());
    let dir = tempfile::tempdir().unwrap();
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let args = ["--tls-cert", &cert.display().to_string(), "--tls-key"]
        .iter()
        .map(|s| s.to_string())
        .chain([key.display().to_string()])
        .collect();
    let mut runner = Service::new(
        ServiceKind::Runner,
        Binaries::get(Profile::Debug).runner,
        dir.path(),
        args,
    );
    runner.tls_ca = Some(cert.clone());
    runner.start().await;
    let address = format!("localhost:{}", runner.addr.port());

    for (lang, mut cmd) in [
        ("python", Command::new(&python)),
        ("node", Command::new("node")),
    ] {
        let tree = gate_tree(&format!("{lang}-over-tls"), "failure");
        match lang {
            "python" => cmd.args(["-c", PYTHON]),
            _ => cmd.env("NODE_PATH", &modules).args(["-e", NODE]),
        };
        cmd.arg(&address).arg(&cert).arg(&tree);
        let lines = Running::spawn(cmd)
            .success(&format!("the {lang} client over TLS"))
            .await;
        assert_eq!(
            lines,
            [
                format!("registered {lang}-over-tls"),
                "plaintext refused".to_string()
            ],
            "{lang}"
        );
    }
}
