//! Compiles proto/weir/v1/*.proto with protox (a pure-Rust protobuf
//! compiler), so no system `protoc` is needed, then generates prost messages
//! and tonic services from the descriptor set.

use std::path::PathBuf;

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let dir = root.join("weir/v1");
    let mut protos: Vec<PathBuf> = std::fs::read_dir(&dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "proto"))
        .collect();
    protos.sort();
    println!("cargo:rerun-if-changed={}", dir.display());
    for p in &protos {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let fds = protox::compile(&protos, [&root])?;
    // The descriptor set is also embedded for gRPC server reflection.
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("weir_descriptor.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure().bytes(".").compile_fds(fds)?;
    Ok(())
}
