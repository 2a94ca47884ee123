//! Compiles the `.proto` files with `protox`, a pure-Rust protobuf compiler, so that a
//! fresh machine needs no system `protoc`. With the `grpc` feature the StoreAPI's service
//! stubs (client and server) are generated beside its messages; without it, only the
//! messages, so that crates that only encode (remote write) do not build tonic.
/// Chunk bytes decode as slices of the received frame, not as copies.
const CHUNK_DATA: &str = ".strata.store.v1.Chunk.data";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["prometheus/remote.proto", "strata/store.proto", "strata/forward.proto", "strata/rules.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["."])?;
    if std::env::var_os("CARGO_FEATURE_GRPC").is_some() {
        tonic_prost_build::configure().build_client(true).build_server(true).bytes(CHUNK_DATA).compile_fds(fds)?;
    } else {
        prost_build::Config::new().bytes([CHUNK_DATA]).compile_fds(fds)?;
    }
    Ok(())
}
