//! The `sse-gateway` binary: see `cli` for the commands.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    sse_gateway::cli::main()
}
