//! The file of one view, kept: its place ([`Place`]: checked, written atomically and only
//! when its bytes change) and the last render's error, which the view's report and
//! `export` show. Every view but the CDI spec (whose report is richer) keeps its file
//! through this.

use std::path::Path;
use std::sync::{Mutex, PoisonError};

use crate::sys::place::Place;

/// A view's file and the last render's error.
pub struct Kept {
    place: Place,
    error: Mutex<Option<String>>,
}

impl Kept {
    /// The file at `place`.
    pub fn new(place: Place) -> Self {
        Kept { place, error: Mutex::default() }
    }

    /// Whether the view is kept at all.
    pub fn enabled(&self) -> bool {
        self.place.enabled
    }

    /// Whether the file can be written (see [`Place::check`]).
    pub fn check(&self) -> Result<(), String> {
        self.place.check()
    }

    /// Where the file goes.
    pub fn path(&self) -> &Path {
        &self.place.path
    }

    /// The file as it is on disk, if there is one the agent may trust.
    pub fn read(&self) -> Option<Vec<u8>> {
        self.place.read()
    }

    /// Why the last render wrote nothing, if it did not.
    pub fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Writes `made` (the file's bytes, or why they could not be made: the file then
    /// stays as it was) when it changed; a failure is logged as `name`'s and kept.
    pub fn keep(&self, name: &str, made: Result<Vec<u8>, String>) {
        let outcome = made.and_then(|bytes| match self.place.write(Some(&bytes)) {
            Ok(true) => {
                tracing::info!("{name} {} written", self.place.path.display());
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(format!("writing {}: {e}", self.place.path.display())),
        });
        let error = outcome.err();
        if let Some(why) = &error {
            tracing::error!("{name}: {why}");
        }
        *self.error.lock().unwrap_or_else(PoisonError::into_inner) = error;
    }
}
