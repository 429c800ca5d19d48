//! The engine thread: it owns the model and the engine, takes requests from
//! the HTTP handlers over a channel and sends each one's events back on its
//! own channel.
//!
//! One loop: take what arrived (block only when idle), cancel the requests
//! whose client went away, run one engine step over everything live,
//! dispatch the events. A request whose events channel is closed (the
//! client disconnected, or its handler was dropped) is cancelled and its
//! K/V blocks freed before the next step.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use hearth::engine::{Engine, EngineError, EngineEvent, FinishReason, GenerateRequest, RequestId};
use hearth::model::AnyModel;
use hearth::Error;
use tokio::sync::{mpsc, oneshot};

use super::error::ApiError;
use super::metrics::Metrics;

/// An event of one choice of a generation.
#[derive(Debug)]
pub struct ChoiceEvent {
    /// Which of the generation's requests (`0..n`, in submission order).
    pub index: usize,
    /// What happened; a request ends with exactly one `Finished`.
    pub event: EngineEvent,
}

/// What the handlers ask of the engine thread.
pub enum Command {
    /// Start requests that answer one HTTP request together (`n` choices,
    /// several prompts): all of them or, with the reason, none.
    Generate {
        /// The engine requests.
        reqs: Vec<GenerateRequest>,
        /// Started, or why none was.
        accepted: oneshot::Sender<Result<(), ApiError>>,
        /// Where their events go; dropping the receiver cancels them.
        events: mpsc::UnboundedSender<ChoiceEvent>,
    },
    /// Cancel everything live (shutdown past its grace period).
    CancelAll,
}

/// A live request's route back to its handler.
struct Route {
    index: usize,
    events: mpsc::UnboundedSender<ChoiceEvent>,
    added: Instant,
    last_token: Option<Instant>,
}

/// The engine and the routes of its live requests.
pub struct Worker {
    engine: Engine<AnyModel>,
    routes: HashMap<RequestId, Route>,
    metrics: Arc<Metrics>,
}

impl Worker {
    /// A worker over a loaded engine.
    pub fn new(engine: Engine<AnyModel>, metrics: Arc<Metrics>) -> Self {
        Worker {
            engine,
            routes: HashMap::new(),
            metrics,
        }
    }

    /// Serves commands until every sender is gone.
    pub fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            if self.engine.has_unfinished() {
                while let Ok(cmd) = commands.try_recv() {
                    self.handle(cmd);
                }
            } else {
                match commands.blocking_recv() {
                    Some(cmd) => self.handle(cmd),
                    None => return,
                }
            }
            self.cancel_abandoned();
            if self.engine.has_unfinished() {
                self.step();
            }
            self.metrics.observe_engine(&self.engine.stats());
            if let Some(experts) = self.engine.model().expert_stats() {
                self.metrics.observe_experts(&experts);
            }
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Generate {
                reqs,
                accepted,
                events,
            } => {
                let result = self.start(reqs, &events);
                // A handler that went away meanwhile is noticed at the next
                // cancel_abandoned.
                let _ = accepted.send(result);
            }
            Command::CancelAll => {
                let ids: Vec<RequestId> = self.routes.keys().copied().collect();
                for id in ids {
                    self.cancel(id, Some("the server is shutting down"));
                }
            }
        }
    }

    /// Adds every request or none.
    fn start(
        &mut self,
        reqs: Vec<GenerateRequest>,
        events: &mpsc::UnboundedSender<ChoiceEvent>,
    ) -> Result<(), ApiError> {
        let now = Instant::now();
        let mut ids = Vec::with_capacity(reqs.len());
        for req in reqs {
            match self.engine.add_request(req) {
                Ok(id) => ids.push(id),
                Err(e) => {
                    for id in ids {
                        let _ = self.engine.cancel(id);
                    }
                    self.metrics.rejected("invalid");
                    return Err(engine_error(e));
                }
            }
        }
        for (index, id) in ids.into_iter().enumerate() {
            self.routes.insert(
                id,
                Route {
                    index,
                    events: events.clone(),
                    added: now,
                    last_token: None,
                },
            );
        }
        Ok(())
    }

    /// Cancels requests nobody listens to any more.
    fn cancel_abandoned(&mut self) {
        let gone: Vec<RequestId> = self
            .routes
            .iter()
            .filter(|(_, r)| r.events.is_closed())
            .map(|(id, _)| *id)
            .collect();
        for id in gone {
            self.metrics.cancelled();
            self.cancel(id, None);
        }
    }

    /// Ends `id` now; its handler (if still there) gets a `Finished` with
    /// `error` (reason `Error`) or reason `Cancelled`.
    fn cancel(&mut self, id: RequestId, error: Option<&str>) {
        let Some(route) = self.routes.remove(&id) else {
            return;
        };
        let Ok(mut event) = self.engine.cancel(id) else {
            return;
        };
        if let (Some(msg), EngineEvent::Finished { reason, error, .. }) = (error, &mut event) {
            *reason = FinishReason::Error;
            *error = Some(msg.to_string());
        }
        let _ = route.events.send(ChoiceEvent {
            index: route.index,
            event,
        });
    }

    /// One engine step and its events. A failed step was undone by the
    /// engine; its requests end with the error rather than retrying a step
    /// that may fail the same way forever.
    fn step(&mut self) {
        match pollster::block_on(self.engine.step()) {
            Ok(events) => {
                for event in events {
                    self.dispatch(event);
                }
            }
            Err(e) => {
                let msg = format!("the model failed to run: {e}");
                eprintln!("serve: {msg}");
                let ids: Vec<RequestId> = self.routes.keys().copied().collect();
                for id in ids {
                    self.cancel(id, Some(&msg));
                }
            }
        }
    }

    fn dispatch(&mut self, event: EngineEvent) {
        let now = Instant::now();
        let (id, finished) = match &event {
            EngineEvent::Token { request, .. } => (*request, false),
            EngineEvent::Finished { request, .. } => (*request, true),
        };
        let Some(route) = self.routes.get_mut(&id) else {
            return;
        };
        match &event {
            EngineEvent::Token { .. } => match route.last_token.replace(now) {
                None => self.metrics.first_token((now - route.added).as_secs_f64()),
                Some(t) => self.metrics.inter_token((now - t).as_secs_f64()),
            },
            EngineEvent::Finished { reason, usage, .. } => {
                let e2e = (now - route.added).as_secs_f64();
                self.metrics.finished(*reason, usage, e2e);
            }
        }
        let index = route.index;
        let sent = route.events.send(ChoiceEvent { index, event });
        if finished {
            self.routes.remove(&id);
        } else if sent.is_err() {
            self.metrics.cancelled();
            self.cancel(id, None);
        }
    }
}

/// The HTTP error for a request the engine refused.
pub fn engine_error(e: Error) -> ApiError {
    match &e {
        Error::Engine(EngineError::PromptTooLong { .. }) => {
            ApiError::bad_param("messages", e.to_string()).with_code("context_length_exceeded")
        }
        Error::Engine(_)
        | Error::Sample(_)
        | Error::Tokenizer(_)
        | Error::Chat(_)
        | Error::Sched(_) => ApiError::bad_request(e.to_string()),
        _ => ApiError::new(axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}
