//! The RunStates of the idle runs: halted for approval by the real runner, padded to a size.

use agentrun::crd::Agent;
use agentrun::state::RunState;
use agentrun::state::pyjson::Value;

use crate::{AGENT_NAME, BenchError};

/// Builds the state of an idle run: `template` (a state halted for approval) for run `run_id`,
/// with earlier user messages of random text prepended until its JSON is at least
/// `target_bytes` long. Only user messages are added, so the scripted model's turn (the number of
/// assistant messages) is unchanged and the state stays resumable.
pub fn padded_state(template: &RunState, run_id: &str, target_bytes: usize) -> RunState {
    use rand::Rng;
    use rand::distr::Alphanumeric;
    // `{"role": "user", "content": ""}` and the `, ` separating it from the next message.
    const OVERHEAD: usize = 33;
    const CHUNK: usize = 4096;
    let mut state = template.clone();
    state.run_id = run_id.to_owned();
    let text = |n: usize| -> String {
        rand::rng()
            .sample_iter(&Alphanumeric)
            .take(n)
            .map(char::from)
            .collect()
    };
    let message = |content: String| {
        Value::from_iter([
            ("role", Value::from("user")),
            ("content", Value::from(content)),
        ])
    };
    let mut size = state.to_json().len();
    let mut padding = Vec::new();
    while size < target_bytes {
        let missing = target_bytes - size;
        let len = missing.saturating_sub(OVERHEAD).clamp(1, CHUNK);
        padding.push(message(text(len)));
        size += len + OVERHEAD;
    }
    state.messages.splice(0..0, padding);
    // The estimate can be a few bytes short: top it up.
    let actual = state.to_json().len();
    if actual < target_bytes {
        state
            .messages
            .insert(0, message(text((target_bytes - actual).max(1))));
    }
    state
}

/// A state halted on the benchmark Agent's call, made by the real runner with the scripted model
/// (no tool is called before approval).
pub(crate) async fn halted_template(agent: &Agent) -> Result<RunState, BenchError> {
    let runnable = agentrun::agent::Agent::from_spec_with_name(AGENT_NAME, &agent.spec)
        .map_err(|e| BenchError::State(e.to_string()))?;
    let runner = agentrun::agent::Runner::new().map_err(|e| BenchError::State(e.to_string()))?;
    let mut state = RunState::new("template", AGENT_NAME, "Set replicas to 3.");
    match runner.step(&runnable, &mut state).await {
        Ok(agentrun::agent::RunStatus::AwaitingApproval) => Ok(state),
        Ok(other) => Err(BenchError::State(format!(
            "the scripted agent did not halt for approval ({other:?})"
        ))),
        Err(e) => Err(BenchError::State(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TOOL_CALL_ID;

    #[test]
    fn padded_state_reaches_the_target_and_stays_halted() {
        let mut template = RunState::new("template", "bench", "Set replicas to 3.");
        template.messages.push(Value::from_iter([
            ("role", Value::from("user")),
            ("content", Value::from("Set replicas to 3.")),
        ]));
        template.messages.push(Value::from_iter([
            ("role", Value::from("assistant")),
            ("content", Value::from("")),
        ]));
        template
            .deferred_tool_requests
            .approvals
            .push(agentrun::state::DeferredToolCall {
                tool_call_id: TOOL_CALL_ID.into(),
                tool_name: "change_config".into(),
                args: Value::from_iter([("key", Value::from("replicas"))]),
            });
        for target in [10, 5000, 64 * 1024] {
            let state = padded_state(&template, "uid-1", target);
            let json = state.to_json();
            assert!(json.len() >= target, "{} < {target}", json.len());
            assert!(
                json.len() <= target.max(template.to_json().len()) + 64,
                "{} for {target}",
                json.len()
            );
            let back = RunState::from_json(&json).unwrap();
            assert_eq!(back.run_id, "uid-1");
            assert_eq!(back.pending_approvals().len(), 1);
            let assistants = back
                .messages
                .iter()
                .filter(|m| m.get("role").and_then(Value::as_str) == Some("assistant"))
                .count();
            assert_eq!(assistants, 1, "padding adds no assistant turn");
        }
    }
}
