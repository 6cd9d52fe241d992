//! The work that runs in the background: forming and driving provider batches, delivering
//! the outbox, deciding where work goes and what it costs, and watching over the tasks.

pub(crate) mod commit;
pub mod evaluation;
pub(crate) mod ledger;
pub(crate) mod outbox;
pub(crate) mod retention;
pub(crate) mod routing;
pub(crate) mod scheduler;
pub(crate) mod supervisor;
pub mod webhook;
