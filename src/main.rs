// glibc malloc spent a fifth of the journal writer's time in arena locks and
// consolidation under load (perf, bench/http.rs); mimalloc does not.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    postern::cli::main()
}
