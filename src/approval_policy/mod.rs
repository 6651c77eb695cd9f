//! The admin's ApprovalPolicies, compiled and evaluated (pure; the controller alone evaluates
//! them, see `docs/approval-policies.md`).
//!
//! A policy compiles into tool-name globs and CEL programs ([`CompiledPolicy::compile`]); a rule
//! that does not compile is kept, broken, so that the calls its tools match need a person (fails
//! closed), and the policy's status says why. [`evaluate`] decides one call: each policy that
//! selects the run's namespace contributes its first matching rule, and the strictest contribution
//! wins (Deny over Require over Allow; among Require, the most approvals).
//! [`gates`] lists the tool globs of every rule, which the worker halts on so that the controller
//! can evaluate the call.

mod cel_values;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::Arc;

use cel::{Context, Program};
use globset::{Glob, GlobSet, GlobSetBuilder};
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};

use crate::crd::{ApprovalPolicy, ApprovalRule, Approvers, PolicyAction, PolicyDecision};

/// A policy ready to evaluate calls.
pub struct CompiledPolicy {
    name: String,
    selector: Result<Option<Selector>, String>,
    rules: Vec<CompiledRule>,
}

impl std::fmt::Debug for CompiledPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompiledPolicy")
            .field("name", &self.name)
            .field("rules", &self.rules.len())
            .finish_non_exhaustive()
    }
}

struct CompiledRule {
    spec: ApprovalRule,
    tools: Result<GlobSet, String>,
    when: When,
}

enum When {
    Always,
    Program(Program),
    Broken(String),
}

/// One call, as a policy's condition sees it.
#[derive(Clone, Copy, Debug)]
pub struct CallFacts<'a> {
    /// The tool's name.
    pub tool: &'a str,
    /// The call's arguments.
    pub args: &'a serde_json::Value,
    /// The Agent's name.
    pub agent: &'a str,
    /// The run's namespace.
    pub namespace: &'a str,
    /// The run's name.
    pub run: &'a str,
    /// The run's labels.
    pub labels: &'a BTreeMap<String, String>,
}

/// What the policies require of one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    /// The deciding rule and its action.
    pub decision: PolicyDecision,
    /// Require only: how many distinct approvals.
    pub required_approvals: Option<u32>,
    /// Require only: who may decide.
    pub approvers: Option<Approvers>,
}

impl CompiledPolicy {
    /// Compiles `policy`'s selector, tool globs and conditions. Nothing fails: what does not
    /// compile is reported by [`errors`](Self::errors) and fails closed when evaluated.
    pub fn compile(policy: &ApprovalPolicy) -> CompiledPolicy {
        let selector = match policy.spec.namespace_selector.clone() {
            None => Ok(None),
            Some(s) => Selector::try_from(s)
                .map(Some)
                .map_err(|e| format!("namespaceSelector: {e}")),
        };
        let rules = policy
            .spec
            .rules
            .iter()
            .map(|rule| CompiledRule {
                spec: rule.clone(),
                tools: compile_globs(&rule.tools),
                when: match rule.when.as_deref() {
                    None => When::Always,
                    Some(text) => match Program::compile(text) {
                        Ok(program) => When::Program(program),
                        Err(e) => When::Broken(one_line(&e.to_string())),
                    },
                },
            })
            .collect();
        CompiledPolicy {
            name: policy.name_any(),
            selector,
            rules,
        }
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What did not compile, one message per problem, naming the rule.
    pub fn errors(&self) -> Vec<String> {
        let mut errors = vec![];
        if let Err(e) = &self.selector {
            errors.push(e.clone());
        }
        for rule in &self.rules {
            if let Err(e) = &rule.tools {
                errors.push(format!("rule {}: tools: {e}", rule.spec.name));
            }
            if let When::Broken(e) = &rule.when {
                errors.push(format!("rule {}: when: {e}", rule.spec.name));
            }
        }
        errors
    }

    /// Whether the policy applies to runs in a namespace with these labels. A selector that
    /// does not compile selects every namespace (its rules then apply everywhere: fail closed).
    pub fn selects(&self, namespace_labels: &BTreeMap<String, String>) -> bool {
        match &self.selector {
            Ok(Some(selector)) => selector.matches(namespace_labels),
            Ok(None) | Err(_) => true,
        }
    }

    /// The policy's first rule matching the call, as a requirement.
    fn first_match(&self, facts: &CallFacts<'_>) -> Option<Requirement> {
        for rule in &self.rules {
            let tool_matches = match &rule.tools {
                Ok(globs) => globs.is_match(facts.tool),
                // A broken glob list may or may not have meant this tool: a person decides.
                Err(e) => return Some(self.needs_person(rule, format!("its tools: {e}"))),
            };
            if !tool_matches {
                continue;
            }
            let applies = match &rule.when {
                When::Always => Ok(true),
                When::Program(program) => run_condition(program, facts),
                When::Broken(e) => Err(format!("its condition does not compile: {e}")),
            };
            match applies {
                Ok(false) => continue,
                Ok(true) => return Some(self.requirement(rule)),
                Err(e) => return Some(self.needs_person(rule, e)),
            }
        }
        None
    }

    fn requirement(&self, rule: &CompiledRule) -> Requirement {
        let spec = &rule.spec;
        let require = spec.action == PolicyAction::Require;
        Requirement {
            decision: PolicyDecision {
                name: Some(self.name.clone()),
                rule: Some(spec.name.clone()),
                action: spec.action,
                message: spec
                    .message
                    .clone()
                    .filter(|_| spec.action == PolicyAction::Deny),
                note: None,
            },
            required_approvals: require.then(|| spec.required_approvals.unwrap_or(1)),
            approvers: spec.approvers.clone().filter(|_| require),
        }
    }

    /// The rule could not be evaluated: the call needs a person (the rule's own approvers and
    /// quorum when it is a Require rule, one approval otherwise).
    fn needs_person(&self, rule: &CompiledRule, why: String) -> Requirement {
        let mut requirement = self.requirement(rule);
        if rule.spec.action != PolicyAction::Require {
            requirement.required_approvals = Some(1);
        }
        requirement.decision.action = PolicyAction::Require;
        requirement.decision.message = None;
        requirement.decision.note = Some(format!(
            "rule {} of ApprovalPolicy {} could not be evaluated ({why}), so a person decides",
            rule.spec.name, self.name
        ));
        requirement
    }
}

fn compile_globs(patterns: &[String]) -> Result<GlobSet, String> {
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        builder.add(Glob::new(pattern).map_err(|e| e.to_string())?);
    }
    builder.build().map_err(|e| e.to_string())
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Runs a rule's condition on the call: `Err` when it fails or is not a boolean.
fn run_condition(program: &Program, facts: &CallFacts<'_>) -> Result<bool, String> {
    let mut context = Context::default();
    context.add_variable_from_value("args", cel_values::from_json(facts.args));
    context.add_variable_from_value("tool", facts.tool.to_owned());
    context.add_variable_from_value("agent", facts.agent.to_owned());
    context.add_variable_from_value("labels", cel_values::from_labels(facts.labels));
    context.add_variable_from_value(
        "run",
        cel_values::from_json(&serde_json::json!({
            "name": facts.run,
            "namespace": facts.namespace,
            "labels": facts.labels,
        })),
    );
    match program.execute(&context) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!(
            "its condition gave {:?}, not a boolean",
            other.type_of()
        )),
        Err(e) => Err(format!(
            "its condition failed: {}",
            one_line(&e.to_string())
        )),
    }
}

/// The requirement the policies set for a call, if any rule matched it.
pub fn evaluate(policies: &[Arc<CompiledPolicy>], facts: &CallFacts<'_>) -> Option<Requirement> {
    let mut ordered: Vec<&Arc<CompiledPolicy>> = policies.iter().collect();
    ordered.sort_by(|a, b| a.name.cmp(&b.name));
    ordered
        .into_iter()
        .filter_map(|p| p.first_match(facts))
        .reduce(|best, next| if stricter(&next, &best) { next } else { best })
}

/// Whether `a` is stricter than `b` (ties keep `b`, the policy first by name).
fn stricter(a: &Requirement, b: &Requirement) -> bool {
    let rank = |r: &Requirement| (r.decision.action, r.required_approvals.unwrap_or(0));
    rank(a) > rank(b)
}

/// The tool globs of every rule of `policies`, sorted and without repeats: the worker halts on
/// every call of a tool they match, so that the controller evaluates it.
pub fn gates(policies: &[Arc<CompiledPolicy>]) -> Vec<String> {
    let mut globs: Vec<String> = policies
        .iter()
        .flat_map(|p| p.rules.iter())
        .flat_map(|r| r.spec.tools.iter().cloned())
        .collect();
    globs.sort();
    globs.dedup();
    globs
}

/// The tools a worker halts on for the controller to evaluate, from [`gates`].
#[derive(Clone, Debug, Default)]
pub struct Gates {
    globs: Option<GlobSet>,
    broken: bool,
}

impl Gates {
    /// The gates of `globs`. A glob that does not compile gates every tool (fail closed).
    pub fn new(globs: &[String]) -> Gates {
        match compile_globs(globs) {
            Ok(set) => Gates {
                globs: (!globs.is_empty()).then_some(set),
                broken: false,
            },
            Err(_) => Gates {
                globs: None,
                broken: true,
            },
        }
    }

    /// Whether calls of `tool` halt for the controller.
    pub fn matches(&self, tool: &str) -> bool {
        self.broken || self.globs.as_ref().is_some_and(|g| g.is_match(tool))
    }
}
