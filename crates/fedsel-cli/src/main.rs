//! The `fedsel` binary: [`fedsel_cli::main_with_args`] on the process's arguments.

fn main() -> std::process::ExitCode {
    std::process::ExitCode::from(fedsel_cli::main_with_args(std::env::args_os()))
}
