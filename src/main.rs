fn main() -> std::process::ExitCode {
    postern::cli::main()
}
