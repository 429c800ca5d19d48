//! Plans replayed as CUDA graphs.
//!
//! A decode step launches hundreds of kernels whose arguments depend only
//! on the plan and on its buffers' sizes: the same plan over the same
//! buffers launches the same kernels with the same arguments, step after
//! step, while the step's data (token ids, positions, slots, block
//! tables) travels in device buffers uploaded before the launch. So the
//! backend records such a plan once into a CUDA graph (stream capture)
//! and replays it, which takes the per-kernel launch cost off the host and
//! the gaps between kernels off the device.
//!
//! A plan is captured the second time it is seen with the same sizes (the
//! first run allocates the scratch the kernels use, which a capture must
//! not), and a graph is dropped when any buffer it points into may have
//! moved (the activation pool or a scratch buffer grew: the backend's
//! generation changed). Plans that stop for the host mid-step (MoE routes
//! read back) run op by op.

use std::collections::VecDeque;

use cudarc::driver::result;
use cudarc::driver::sys;
use hearth::graph::plan::Plan;

/// Graphs kept (an LRU): the step shapes a model cycles through.
const KEEP: usize = 32;

/// One instantiated graph.
pub struct Graph {
    exec: sys::CUgraphExec,
    graph: sys::CUgraph,
}

impl Graph {
    /// Ends the capture on `stream` and instantiates what it recorded.
    ///
    /// # Safety
    /// `stream` is capturing (began with [`begin`]) in the current context.
    pub unsafe fn end(stream: sys::CUstream) -> Result<Self, result::DriverError> {
        let graph = result::stream::end_capture(stream)?;
        match result::graph::instantiate(graph, sys::CUgraphInstantiate_flags(0)) {
            Ok(exec) => Ok(Graph { exec, graph }),
            Err(e) => {
                let _ = result::graph::destroy(graph);
                Err(e)
            }
        }
    }

    /// Launches the graph on `stream`.
    ///
    /// # Safety
    /// Every buffer the graph's kernels use is alive.
    pub unsafe fn launch(&self, stream: sys::CUstream) -> Result<(), result::DriverError> {
        result::graph::launch(self.exec, stream)
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: made by `end`, destroyed once.
        unsafe {
            let _ = result::graph::exec_destroy(self.exec);
            let _ = result::graph::destroy(self.graph);
        }
    }
}

/// Begins capturing `stream` (relaxed: allocation calls elsewhere in the
/// process stay legal).
///
/// # Safety
/// `stream` is a stream of the current context, not the legacy one.
pub unsafe fn begin(stream: sys::CUstream) -> Result<(), result::DriverError> {
    result::stream::begin_capture(
        stream,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
    )
}

/// What a graph was recorded from: the plan, its activation sizes, the
/// held buffers it read, and the backend's buffer generation then.
#[derive(PartialEq)]
struct Key {
    plan: Plan,
    sizes: Vec<u64>,
    held: Vec<u64>,
    generation: u64,
}

/// A plan seen once (`None`: not captured yet) or captured.
struct Entry {
    key: Key,
    graph: Option<Graph>,
}

/// The graphs of the backend.
#[derive(Default)]
pub struct Graphs {
    entries: VecDeque<Entry>,
    /// Replays and captures so far (for reports and tests).
    pub replays: u64,
    /// Captures so far.
    pub captures: u64,
}

/// What to do with a plan.
pub enum Action<'a> {
    /// Record it op by op (first sight).
    Record,
    /// Record it op by op under capture, then [`Graphs::captured`].
    Capture,
    /// Replay this graph.
    Replay(&'a Graph),
}

impl Graphs {
    /// The action for `plan` over buffers of `sizes` and held buffers at
    /// `held`, in buffer generation `generation`.
    pub fn action(
        &mut self,
        plan: &Plan,
        sizes: &[u64],
        held: &[u64],
        generation: u64,
    ) -> Action<'_> {
        self.entries.retain(|e| e.key.generation == generation);
        let found = self
            .entries
            .iter()
            .position(|e| e.key.sizes == sizes && e.key.held == held && e.key.plan == *plan);
        match found {
            Some(i) => {
                if let Some(e) = self.entries.remove(i) {
                    self.entries.push_front(e);
                }
                match self.entries.front() {
                    Some(Entry { graph: Some(g), .. }) => {
                        self.replays += 1;
                        Action::Replay(g)
                    }
                    _ => Action::Capture,
                }
            }
            None => {
                self.entries.push_front(Entry {
                    key: Key {
                        plan: plan.clone(),
                        sizes: sizes.to_vec(),
                        held: held.to_vec(),
                        generation,
                    },
                    graph: None,
                });
                self.entries.truncate(KEEP);
                Action::Record
            }
        }
    }

    /// Stores the graph captured for the plan [`Graphs::action`] last
    /// answered [`Action::Capture`] for (the front entry).
    pub fn captured(&mut self, graph: Graph) {
        if let Some(e) = self.entries.front_mut() {
            e.graph = Some(graph);
            self.captures += 1;
        }
    }

    /// Forgets every graph.
    pub fn clear(&mut self) {
        self.entries.clear();
    }
}
