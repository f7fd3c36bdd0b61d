//! Decoding (`maxrs decode`, MaxText's `decode.py`): prompts in, generated tokens out, through
//! the same model code as training (`Model::decode`, the families' layers unchanged).
//!
//! - [`programs`]: the traced prefill and generate programs (`Engine`), the key/value cache's
//!   layout and sharding.
//! - [`sampling`]: MaxText's sampling strategies, in the graph.
//! - [`session`]: the programs compiled, the parameters on the devices, and the host loop with
//!   its stops (EOS, the step budget) and timings.
//! - [`run`]: `maxrs decode`'s job: config, prompts (token ids or text), the session, the
//!   printed result.

pub mod programs;
pub mod run;
pub mod sampling;
pub mod session;

pub use programs::Engine;
pub use sampling::Sampling;
pub use session::{Generation, ParamSource, Session};
