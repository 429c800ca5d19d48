//! The scalar reference implementation of every format: THE oracle.
//!
//! Plain, obviously correct code. Never optimised, never a production path.

pub mod kquants;
