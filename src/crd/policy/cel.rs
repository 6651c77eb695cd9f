//! The CEL expressions the policies share: the decider stamp (JSON of `request.userInfo`), the
//! normalised form identities are compared in, and who counts as a controller identity.

use super::super::GROUP;
use super::{CONTROLLER_VERB, GITOPS_GROUP};

/// A CEL expression for the JSON string literal (quotes included) of the string `expr`: it
/// escapes the backslash, the double quote and every control character as JSON requires.
pub fn cel_json_string(expr: &str) -> String {
    let mut out = format!("({expr}).replace('\\\\', '\\\\\\\\').replace('\"', '\\\\\"')");
    for code in 0u32..0x20 {
        let escaped = match code {
            0x08 => "\\\\b".to_owned(),
            0x09 => "\\\\t".to_owned(),
            0x0a => "\\\\n".to_owned(),
            0x0c => "\\\\f".to_owned(),
            0x0d => "\\\\r".to_owned(),
            _ => format!("\\\\u{code:04x}"),
        };
        out.push_str(&format!(".replace('\\u{code:04x}', '{escaped}')"));
    }
    format!("'\"' + {out} + '\"'")
}

/// The CEL expression both the stamp and the check compute: `request.userInfo` as the JSON of
/// [`DecidedBy`](super::DecidedBy).
pub fn decided_by_stamp_expression() -> String {
    format!(
        "'{{\"username\":' + {username} + ',\"uid\":' + {uid} + ',\"groups\":[' + (has(request.userInfo.groups) ? request.userInfo.groups.map(g, {group}).join(',') : '') + ']}}'",
        username = cel_json_string("request.userInfo.username"),
        uid = cel_json_string("has(request.userInfo.uid) ? request.userInfo.uid : ''"),
        group = cel_json_string("g"),
    )
}

/// CEL: the string `expr` in the form identities are compared in: surrounding whitespace
/// trimmed and ASCII letters lowercased, so `" Carol@Example.com "` and `carol@example.com` are
/// one person. (Stamps keep the exact username; only comparisons normalise.)
pub fn normalized(expr: &str) -> String {
    format!("({expr}).trim().lowerAscii()")
}

/// CEL: true when the request comes from a controller identity: a member of `system:masters`, or
/// an identity RBAC allows the verb [`CONTROLLER_VERB`] on `agentruns` in the request's namespace
/// (the Helm chart grants it to its controller ServiceAccount, in the namespaces it watches).
pub fn controller_identity() -> String {
    format!(
        "(has(request.userInfo.groups) && 'system:masters' in request.userInfo.groups) || authorizer.group('{GROUP}').resource('agentruns').namespace(request.namespace).check('{CONTROLLER_VERB}').allowed()"
    )
}

/// CEL: true when the requester is a member of [`GITOPS_GROUP`].
pub fn in_gitops_group() -> String {
    format!("has(request.userInfo.groups) && '{GITOPS_GROUP}' in request.userInfo.groups")
}

/// CEL: entry `key` is the same in the maps `new` and `old` (present in both with the same value,
/// or absent from both).
pub fn entry_unchanged(new: &str, old: &str, key: &str) -> String {
    format!(
        "(('{key}' in {new}) == ('{key}' in {old}) && (!('{key}' in {new}) || {new}['{key}'] == {old}['{key}']))"
    )
}

/// CEL: a list literal of the strings `items`.
pub fn string_list(items: &[&str]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("'{i}'")).collect();
    format!("[{}]", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stamp_escapes_every_character_json_requires() {
        let expr = cel_json_string("x");
        assert!(expr.starts_with("'\"' + (x)"), "{expr}");
        assert!(expr.contains(r#".replace('\\', '\\\\')"#), "{expr}");
        assert!(expr.contains(r#".replace('"', '\\"')"#), "{expr}");
        assert!(expr.contains(r#".replace('\u000a', '\\n')"#), "{expr}");
        assert!(expr.contains(r#".replace('\u0000', '\\u0000')"#), "{expr}");
        assert!(expr.contains(r#".replace('\u001f', '\\u001f')"#), "{expr}");
        assert_eq!(expr.matches(".replace(").count(), 34);
        // The backslash goes first, or the escapes added later would be doubled.
        assert!(expr.find(r#"'\\', '\\\\'"#).unwrap() < expr.find(r#"'"', '\\"'"#).unwrap());
        let stamp = decided_by_stamp_expression();
        for field in ["username", "uid", "groups"] {
            assert!(stamp.contains(&format!("\"{field}\":")), "{stamp}");
        }
    }

    #[test]
    fn identities_are_compared_trimmed_and_lowercased() {
        assert_eq!(normalized("x"), "(x).trim().lowerAscii()");
        let controller = controller_identity();
        assert!(controller.contains("'system:masters' in request.userInfo.groups"));
        assert!(controller.contains(
            "authorizer.group('agentrun.dev').resource('agentruns').namespace(request.namespace).check('control').allowed()"
        ));
        assert_eq!(string_list(&["a", "b"]), "['a', 'b']");
        assert_eq!(
            entry_unchanged("n", "o", "k"),
            "(('k' in n) == ('k' in o) && (!('k' in n) || n['k'] == o['k']))"
        );
    }
}
