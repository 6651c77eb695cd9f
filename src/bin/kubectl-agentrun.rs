//! `kubectl-agentrun`: the kubectl plugin of agentrun. Copy it onto `PATH` and run it as
//! `kubectl agentrun list|show|approve|reject|audit`; see [`agentrun::plugin`].

fn main() -> std::process::ExitCode {
    agentrun::plugin::main()
}
