//! The file of one view, kept: its place ([`Place`]: checked, written atomically and only
//! when its bytes change), and a render's failure logged as the view's. Every view but
//! the CDI spec (whose report, `gpushare-ctl cdi`, keeps its last error) keeps its file
//! through this.

use crate::sys::place::Place;
use std::path::Path;

/// A view's file.
pub struct Kept {
    place: Place,
}

impl Kept {
    /// The file at `place`.
    pub fn new(place: Place) -> Self {
        Kept { place }
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

    /// Writes `made` (the file's bytes, or why they could not be made: the file then
    /// stays as it was) when it changed; a failure is logged as `name`'s.
    pub fn keep(&self, name: &str, made: Result<Vec<u8>, String>) {
        let outcome = made.and_then(|bytes| match self.place.write(Some(&bytes)) {
            Ok(true) => {
                tracing::info!("{name} {} written", self.place.path.display());
                Ok(())
            }
            Ok(false) => Ok(()),
            Err(e) => Err(format!("writing {}: {e}", self.place.path.display())),
        });
        if let Err(why) = outcome {
            tracing::error!("{name}: {why}");
        }
    }
}
