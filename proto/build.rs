//! Compiles the `.proto` files with `protox`, a pure-Rust protobuf compiler, so that a
//! fresh machine needs no system `protoc`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["prometheus/remote.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    prost_build::Config::new().compile_fds(fds)?;
    Ok(())
}
