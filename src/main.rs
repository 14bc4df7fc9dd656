// Under load glibc malloc/free took about a fifth of postern's CPU samples (perf during
// bench/http.rs); with mimalloc the CPU per request there roughly halved.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    postern::cli::main()
}
