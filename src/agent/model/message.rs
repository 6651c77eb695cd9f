//! Reading chat-completions messages: their role, their text and their tool calls.

use std::collections::HashSet;

use crate::state::pyjson::Value;

/// One tool call of an assistant message.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The id the model gave the call (`tool_calls[i].id`).
    pub id: String,
    /// The tool's name (`tool_calls[i].function.name`).
    pub name: String,
    /// The arguments as the model wrote them.
    pub arguments: ToolArguments,
}

/// Tool call arguments as written: OpenAI sends a JSON string; some compatible APIs an object.
#[derive(Clone, Debug, PartialEq)]
pub enum ToolArguments {
    /// A JSON document in a string (the OpenAI shape).
    Text(String),
    /// An already-decoded value.
    Value(Value),
}

/// The `role` of a history message.
pub fn role(message: &Value) -> Option<&str> {
    match message {
        Value::Dict(d) => match d.get("role") {
            Some(Value::Str(s)) => Some(s),
            _ => None,
        },
        _ => None,
    }
}

/// The text of a message's `content`: a string, the `text` parts of a list, or empty.
pub fn content_text(message: &Value) -> String {
    let Value::Dict(d) = message else {
        return String::new();
    };
    match d.get("content") {
        Some(Value::Str(s)) => s.clone(),
        Some(Value::List(parts)) => parts
            .iter()
            .filter_map(|part| match part {
                Value::Dict(p) => match p.get("text") {
                    Some(Value::Str(s)) => Some(s.as_str()),
                    _ => None,
                },
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

/// The tool calls of an assistant message (empty when it has none), checked for shape and
/// unique ids.
pub fn tool_calls(message: &Value) -> Result<Vec<ToolCall>, String> {
    let Value::Dict(d) = message else {
        return Err("the message is not a JSON object".to_owned());
    };
    let list = match d.get("tool_calls") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::List(list)) => list,
        Some(_) => return Err("`tool_calls` is not a list".to_owned()),
    };
    let mut calls = Vec::with_capacity(list.len());
    let mut ids = HashSet::new();
    for (i, call) in list.iter().enumerate() {
        let Value::Dict(call) = call else {
            return Err(format!("tool_calls[{i}] is not an object"));
        };
        let id = match call.get("id") {
            Some(Value::Str(id)) if !id.is_empty() => id.clone(),
            _ => return Err(format!("tool_calls[{i}].id is missing or not a string")),
        };
        if !ids.insert(id.clone()) {
            return Err(format!("tool call id `{id}` appears twice"));
        }
        let Some(Value::Dict(function)) = call.get("function") else {
            return Err(format!(
                "tool_calls[{i}].function is missing or not an object"
            ));
        };
        let name = match function.get("name") {
            Some(Value::Str(name)) => name.clone(),
            _ => {
                return Err(format!(
                    "tool_calls[{i}].function.name is missing or not a string"
                ));
            }
        };
        let arguments = match function.get("arguments") {
            None | Some(Value::Null) => ToolArguments::Text(String::new()),
            Some(Value::Str(text)) => ToolArguments::Text(text.clone()),
            Some(value @ Value::Dict(_)) => ToolArguments::Value(value.clone()),
            Some(_) => {
                return Err(format!(
                    "tool_calls[{i}].function.arguments is neither a string nor an object"
                ));
            }
        };
        calls.push(ToolCall {
            id,
            name,
            arguments,
        });
    }
    Ok(calls)
}

/// Sets the arguments of the tool call `id` among the assistant messages of `history` to the JSON
/// text `arguments` (the OpenAI shape, a string); `false` when no such call exists.
pub fn set_tool_call_arguments(history: &mut [Value], id: &str, arguments: &str) -> bool {
    for message in history.iter_mut() {
        if role(message) != Some("assistant") {
            continue;
        }
        let Value::Dict(d) = message else { continue };
        let Some(Value::List(calls)) = d.get_mut("tool_calls") else {
            continue;
        };
        for call in calls.iter_mut() {
            let Value::Dict(call) = call else { continue };
            if call.get("id").and_then(Value::as_str) != Some(id) {
                continue;
            }
            if let Some(Value::Dict(function)) = call.get_mut("function") {
                function.insert("arguments", Value::from(arguments));
                return true;
            }
        }
    }
    false
}
