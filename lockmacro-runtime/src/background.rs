//! Where a client's own work runs: the watchdog, the release subscriber, and the releases
//! nobody waits for (a guard dropped by a panic or a cancelled future).
//!
//! A Redis client runs them on a thread of its own with its own runtime, so they go on whatever
//! happens to the runtimes of callers (one per `#[tokio::test]`, say). The in-memory client runs
//! them on the runtime that uses it, so that a test's paused clock drives its watchdog too; if
//! that runtime goes away, they start again on the next one that uses the client.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::sync::lock;

/// A task that lasts as long as the client, ended by the token it is given; startable again.
type Service =
    Arc<dyn Fn(CancellationToken) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

pub(crate) enum Background {
    /// A thread and runtime of the client's own.
    Thread {
        handle: Handle,
        tasks: TaskTracker,
        stop: CancellationToken,
    },
    /// The runtime of whoever calls.
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    Callers(Mutex<OnCallers>),
}

/// The services of a client that runs on its callers' runtime, and where they run now.
#[derive(Default)]
pub(crate) struct OnCallers {
    services: Vec<Service>,
    /// The runtime running them: closed once it is gone, and the token that stops them.
    running: Option<(oneshot::Sender<()>, CancellationToken)>,
}

impl Background {
    /// Starts the client's own thread and returns it with a handle to its runtime. The thread
    /// ends once this is dropped and the tasks spawned with [`spawn`](Self::spawn) have finished
    /// (each is bounded: a release gives up at its lease's end).
    pub(crate) fn thread() -> std::io::Result<(Self, Handle)> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = runtime.handle().clone();
        let tasks = TaskTracker::new();
        let stop = CancellationToken::new();
        let (until_stopped, draining) = (stop.clone(), tasks.clone());
        std::thread::Builder::new()
            .name("lockmacro-watchdog".into())
            .spawn(move || {
                runtime.block_on(async move {
                    until_stopped.cancelled().await;
                    draining.close();
                    draining.wait().await;
                });
            })?;
        let background = Self::Thread {
            handle: handle.clone(),
            tasks,
            stop,
        };
        Ok((background, handle))
    }

    /// Runs everything on the runtime that uses the client.
    #[cfg(feature = "test-util")]
    pub(crate) fn on_callers_runtime() -> Self {
        Self::Callers(Mutex::default())
    }

    /// Runs `task` in the background: on the client's thread, or the caller's runtime.
    pub(crate) fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        match self {
            Self::Thread { handle, tasks, .. } => {
                tasks.spawn_on(task, handle);
            }
            Self::Callers(_) => match Handle::try_current() {
                Ok(handle) => drop(handle.spawn(task)),
                Err(_) => tracing::debug!("no runtime to run a background task on; skipped"),
            },
        }
    }

    /// Runs a task that lasts as long as the client, ended by the token it is given.
    pub(crate) fn spawn_service<F, Fut>(&self, service: F)
    where
        F: Fn(CancellationToken) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        match self {
            Self::Thread { stop, .. } => self.spawn(service(stop.clone())),
            Self::Callers(callers) => {
                let service: Service = Arc::new(move |stop| Box::pin(service(stop)));
                let mut callers = lock(callers);
                if let Some((_, stop)) = &callers.running
                    && let Ok(handle) = Handle::try_current()
                {
                    handle.spawn(service(stop.clone()));
                }
                callers.services.push(service);
            }
        }
    }

    /// Makes sure the services run, on the current runtime if the one running them is gone.
    pub(crate) fn ensure_running(&self) {
        let Self::Callers(callers) = self else {
            return;
        };
        let mut callers = lock(callers);
        if callers
            .running
            .as_ref()
            .is_some_and(|(alive, _)| !alive.is_closed())
        {
            return;
        }
        let Ok(handle) = Handle::try_current() else {
            return;
        };
        let (alive, dropped_with_runtime) = oneshot::channel::<()>();
        // Ends when this runtime shuts down (closing `alive`) or the client goes.
        handle.spawn(async move {
            let _ = dropped_with_runtime.await;
        });
        let stop = CancellationToken::new();
        for service in &callers.services {
            handle.spawn(service(stop.clone()));
        }
        if let Some((_, previous)) = callers.running.replace((alive, stop)) {
            previous.cancel();
        }
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        match self {
            Self::Thread { stop, .. } => stop.cancel(),
            Self::Callers(callers) => {
                if let Some((_, stop)) = &lock(callers).running {
                    stop.cancel();
                }
            }
        }
    }
}
