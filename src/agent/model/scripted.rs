//! The scripted model: fixed assistant turns, for demos and tests.

use std::collections::HashSet;

use super::{ModelError, ModelRequest, ModelResponse, role};
use crate::agent::AgentError;
use crate::crd::ScriptedModel;
use crate::state::pyjson::Value;

/// A scripted model: the assistant messages it plays, pre-rendered in the OpenAI shape.
#[derive(Clone, Debug)]
pub struct ScriptedProvider {
    turns: Vec<serde_json::Value>,
}

impl ScriptedProvider {
    pub(super) fn from_spec(spec: &ScriptedModel) -> Result<ScriptedProvider, AgentError> {
        let mut seen_ids = HashSet::new();
        let mut turns = Vec::with_capacity(spec.turns.len());
        for (t, turn) in spec.turns.iter().enumerate() {
            let mut calls = Vec::with_capacity(turn.tool_calls.len());
            for (c, call) in turn.tool_calls.iter().enumerate() {
                let field = |name: &str| format!("model.scripted.turns[{t}].toolCalls[{c}].{name}");
                if call.id.is_empty() {
                    return Err(AgentError::invalid(field("id"), "must not be empty"));
                }
                if !seen_ids.insert(call.id.as_str()) {
                    return Err(AgentError::invalid(
                        field("id"),
                        format!(
                            "tool call id `{}` is used twice; approvals are keyed by tool call id, \
                             so ids must be unique in the script",
                            call.id
                        ),
                    ));
                }
                if call.name.is_empty() {
                    return Err(AgentError::invalid(field("name"), "must not be empty"));
                }
                let arguments = match &call.arguments {
                    serde_json::Value::Null => "{}".to_owned(),
                    args @ serde_json::Value::Object(_) => args.to_string(),
                    _ => {
                        return Err(AgentError::invalid(
                            field("arguments"),
                            "must be a JSON object",
                        ));
                    }
                };
                calls.push(serde_json::json!({
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": arguments},
                }));
            }
            let mut message = serde_json::Map::new();
            message.insert("role".to_owned(), "assistant".into());
            message.insert(
                "content".to_owned(),
                turn.content
                    .clone()
                    .map_or(serde_json::Value::Null, Into::into),
            );
            if !calls.is_empty() {
                message.insert("tool_calls".to_owned(), serde_json::Value::Array(calls));
            }
            turns.push(serde_json::Value::Object(message));
        }
        Ok(ScriptedProvider { turns })
    }

    /// The number of turns in the script.
    pub fn len(&self) -> usize {
        self.turns.len()
    }

    /// Whether the script has no turns.
    pub fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    pub(super) fn complete(&self, request: ModelRequest<'_>) -> Result<ModelResponse, ModelError> {
        let played = request
            .history
            .iter()
            .filter(|m| role(m) == Some("assistant"))
            .count();
        let turn = self.turns.get(played).ok_or(ModelError::ScriptExhausted {
            turn: played + 1,
            available: self.turns.len(),
        })?;
        Ok(ModelResponse {
            message: Value::from(turn.clone()),
            input_tokens: 0,
            output_tokens: 0,
        })
    }
}
