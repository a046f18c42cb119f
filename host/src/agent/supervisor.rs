//! Running a process in a task of its own, so that a panic in it is caught and reported
//! instead of leaving its channel waiting for a report that never comes.

use std::any::Any;
use std::future::Future;

/// Runs `process` in its own task and waits for it. `Err` says why it did not end
/// normally: it panicked (with the panic's message) or the runtime shut down under it.
pub(crate) async fn run_supervised(
    process: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    match tokio::spawn(process).await {
        Ok(()) => Ok(()),
        Err(err) if err.is_panic() => Err(format!(
            "panicked: {}",
            panic_message(err.into_panic().as_ref())
        )),
        Err(_) => Err("stopped: the runtime shut down".to_owned()),
    }
}

/// The message of a panic payload, if it carries one.
fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}
