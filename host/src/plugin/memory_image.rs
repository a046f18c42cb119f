//! A component's copy-on-write memory images, made before its instance, and made again
//! when the kernel refuses one as busy.
//!
//! On Linux wasmtime copies a component's initial linear memory into a sealed `memfd` the
//! first time it is instantiated (its artifact is deserialized from a checked buffer, not
//! mapped from a file). Sealing it against writes fails with `EBUSY` while the kernel still
//! counts a reference to one of its pages, which a page just written can keep for a moment
//! from another CPU's batch. Made inside the instantiation, that failure stopped a plugin's
//! first call as if the plugin had passed a bad value. Made here, before a store holds any
//! of the instance, it is simply tried again. It stays lazy: a plugin never called never
//! holds its image.

use std::time::Duration;

use wasmtime::component::Component;

/// How many times making the images is tried before the call fails.
pub(crate) const ATTEMPTS: u32 = 8;

/// The pause between two attempts; the kernel drops such a reference within milliseconds.
const PAUSE: Duration = Duration::from_millis(5);

/// Makes `component`'s memory images if they are not made yet (after the first success this
/// is a check per core module), trying again while the kernel refuses to seal one as busy.
pub(crate) async fn prepare(component: &Component) -> wasmtime::Result<()> {
    retrying(
        || component.initialize_copy_on_write_image(),
        async |_| tokio::time::sleep(PAUSE).await,
    )
    .await
}

/// Runs `make` until it succeeds, fails for a reason other than a busy resource, or has
/// been tried [`ATTEMPTS`] times; `pause` runs between attempts with the attempt's number.
async fn retrying(
    mut make: impl FnMut() -> wasmtime::Result<()>,
    mut pause: impl AsyncFnMut(u32),
) -> wasmtime::Result<()> {
    let mut attempt = 1;
    loop {
        match make() {
            Err(err) if attempt < ATTEMPTS && is_busy(&err) => pause(attempt).await,
            done => return done,
        }
        attempt += 1;
    }
}

/// Whether `err` is the kernel's `EBUSY`, somewhere in its chain.
fn is_busy(err: &wasmtime::Error) -> bool {
    err.chain()
        .filter_map(|cause| cause.downcast_ref::<std::io::Error>())
        .any(|io| io.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy() -> wasmtime::Error {
        wasmtime::Error::from(std::io::Error::from_raw_os_error(
            rustix::io::Errno::BUSY.raw_os_error(),
        ))
        .context("sealing the memory image")
    }

    #[tokio::test]
    async fn a_busy_seal_is_tried_again_until_it_succeeds() {
        let mut tries = 0;
        let mut pauses = Vec::new();
        let made = retrying(
            || {
                tries += 1;
                if tries < 3 { Err(busy()) } else { Ok(()) }
            },
            async |attempt| pauses.push(attempt),
        )
        .await;
        assert!(made.is_ok());
        assert_eq!(tries, 3);
        assert_eq!(pauses, [1, 2]);
    }

    #[tokio::test]
    async fn a_seal_busy_every_time_gives_up_after_the_last_attempt() {
        let mut tries = 0;
        let made = retrying(
            || {
                tries += 1;
                Err(busy())
            },
            async |_| {},
        )
        .await;
        assert!(is_busy(&made.unwrap_err()));
        assert_eq!(tries, ATTEMPTS);
    }

    #[tokio::test]
    async fn another_failure_is_not_tried_again() {
        let mut tries = 0;
        let made = retrying(
            || {
                tries += 1;
                Err(wasmtime::Error::from(std::io::Error::from(
                    std::io::ErrorKind::OutOfMemory,
                )))
            },
            async |_| {},
        )
        .await;
        assert!(!is_busy(&made.unwrap_err()));
        assert_eq!(tries, 1);
    }

    #[tokio::test]
    async fn a_component_gets_its_image_without_an_instance() {
        // A component with an initialized memory: its image (a memfd on Linux) is made
        // with no store and no instance.
        let engine = wasmtime::Engine::default();
        let component = Component::new(
            &engine,
            r#"(component (core module (memory 1) (data (i32.const 0) "image")))"#,
        )
        .unwrap();
        prepare(&component).await.unwrap();
    }
}
