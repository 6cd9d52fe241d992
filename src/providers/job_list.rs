//! Finding the job an intent created in a provider's paged job list, for providers whose
//! create is not idempotent and who keep our batch key in a job's name.

use std::future::Future;
use std::time::Duration;

use super::{Lookup, ProviderError};

/// One page of a provider's job list, as a lookup reads it.
pub(crate) struct JobListPage {
    /// The job on this page that the intent created, if there is one.
    pub(crate) ours: Option<String>,
    /// Where the next page starts; none (or empty) at the end of the list.
    pub(crate) next: Option<String>,
}

/// Reads the list page by page: found, absent once the whole list was read, undecided
/// when the list is longer than `max_pages`. A job may hide past the pages read, and a
/// resubmit would then pay for the same work twice, so an unfinished walk never answers
/// absent.
pub(crate) async fn find_in_job_list<F, Fut>(
    max_pages: usize,
    recheck_after: Duration,
    unfinished: impl FnOnce() -> String,
    mut read_page: F,
) -> Result<Lookup, ProviderError>
where
    F: FnMut(Option<String>) -> Fut,
    Fut: Future<Output = Result<JobListPage, ProviderError>>,
{
    let mut token = None;
    for _ in 0..max_pages {
        let page = read_page(token.take()).await?;
        if let Some(job) = page.ours {
            return Ok(Lookup::Found(job));
        }
        match page.next.filter(|t| !t.is_empty()) {
            Some(next) => token = Some(next),
            None => return Ok(Lookup::Absent),
        }
    }
    Ok(Lookup::Undecided { recheck_after, reason: unfinished() })
}
