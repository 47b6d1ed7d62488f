//! Compiles `proto/` with protox (pure Rust, no `protoc`) and generates the tonic stubs, plus the
//! encoded descriptor set that server reflection serves.

use std::{env, path::PathBuf};

use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto_root = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?).join("../proto");
    let files = [
        "arbor/runner/v1/types.proto",
        "arbor/runner/v1/events.proto",
        "arbor/runner/v1/runner_service.proto",
        "arbor/runner/v1/worker_service.proto",
        "arbor/approval/v1/approval_service.proto",
    ];
    println!("cargo:rerun-if-changed={}", proto_root.display());
    let fds = protox::compile(files, [&proto_root])?;

    let out_dir = PathBuf::from(env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("arbor_descriptor.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;
    Ok(())
}
