//! The integration tests that need no control plane: the RunState contract and its wire
//! compatibility with Python, the agent loop against loopback model and tool servers, the
//! `agentrun state` and `agentrun run` commands, the generated CRDs and policies, and MCP tools
//! of servers nobody here wrote (on loopback).

mod agent_loop;
mod assertion_python;
mod crd_generated;
mod mcp_tools;
mod state_cli;
mod state_contract;
mod state_python_vectors;
