//! `agentrun crdgen`: writes the CustomResourceDefinitions generated from the Rust types, with the
//! admission policies and RBAC roles installed beside them.

use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `agentrun crdgen`.
#[derive(Debug, clap::Args)]
pub struct CrdgenArgs {
    /// The folder to write agent.yaml, agentrun.yaml, approvalrequest.yaml,
    /// admission-policies.yaml and roles.yaml into.
    #[arg(long, value_name = "DIR", default_value = "crds")]
    pub out: PathBuf,
}

/// Writes the CRDs, admission policies and roles into `--out`, printing each path written. Exit
/// code 1 with the error on stderr when a file cannot be written.
pub fn main(args: CrdgenArgs) -> ExitCode {
    match crate::crd::write_crds(&args.out) {
        Ok(paths) => {
            for path in paths {
                println!("{}", path.display());
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("agentrun crdgen: {err}");
            ExitCode::FAILURE
        }
    }
}
