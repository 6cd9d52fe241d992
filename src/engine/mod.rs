//! The work that runs in the background: forming and driving provider batches, delivering
//! the outbox, deciding where work goes and what it costs, and watching over the tasks.

pub mod commit;
pub mod ledger;
pub mod outbox;
pub mod retention;
pub mod routing;
pub mod scheduler;
pub mod supervisor;
pub mod webhook;
