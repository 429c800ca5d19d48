//! Where the engine's timings come from.

/// A monotonic clock in seconds. Natively [`Clock::system`] reads
/// `std::time::Instant`; the browser passes `performance.now() / 1000` with
/// [`Clock::from_fn`]. [`Clock::none`] always reads 0 (timings then read 0).
pub struct Clock {
    now: Box<dyn Fn() -> f64 + Send>,
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

impl Clock {
    /// A clock reading `now()` (seconds, non-decreasing).
    pub fn from_fn(now: impl Fn() -> f64 + Send + 'static) -> Self {
        Clock { now: Box::new(now) }
    }

    /// A clock that always reads 0.
    pub fn none() -> Self {
        Self::from_fn(|| 0.0)
    }

    /// The system's monotonic clock, seconds since this call.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn system() -> Self {
        let start = std::time::Instant::now();
        Self::from_fn(move || start.elapsed().as_secs_f64())
    }

    /// The default clock: [`Clock::system`] natively; [`Clock::none`] on
    /// wasm32, where `Instant::now` panics (set one with `Engine::set_clock`).
    pub fn default_for_target() -> Self {
        #[cfg(not(target_arch = "wasm32"))]
        {
            Self::system()
        }
        #[cfg(target_arch = "wasm32")]
        {
            Self::none()
        }
    }

    /// Seconds now.
    pub fn now(&self) -> f64 {
        (self.now)()
    }
}
