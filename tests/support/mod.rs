//! Shared support for the integration tests. Each test binary includes it with `mod support;`.
#![allow(dead_code)]
pub mod cluster;
pub mod model_server;
pub mod operator;
pub mod tool_server;
