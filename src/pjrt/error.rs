//! The error type of the PJRT layer: either the plugin's own error (its status code and message,
//! copied out of the `PJRT_Error`, which is then destroyed) or a refusal by maxrs before the
//! plugin was called (wrong argument count, shape or dtype; a function the plugin lacks).

use std::fmt;

/// XLA's status codes, as `PJRT_Error_GetCode` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    Cancelled,
    Unknown,
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    AlreadyExists,
    PermissionDenied,
    ResourceExhausted,
    FailedPrecondition,
    Aborted,
    OutOfRange,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
}

impl ErrorCode {
    pub fn from_raw(code: i32) -> ErrorCode {
        use ErrorCode::*;
        match code {
            1 => Cancelled,
            3 => InvalidArgument,
            4 => DeadlineExceeded,
            5 => NotFound,
            6 => AlreadyExists,
            7 => PermissionDenied,
            8 => ResourceExhausted,
            9 => FailedPrecondition,
            10 => Aborted,
            11 => OutOfRange,
            12 => Unimplemented,
            13 => Internal,
            14 => Unavailable,
            15 => DataLoss,
            16 => Unauthenticated,
            _ => Unknown,
        }
    }

    pub fn to_raw(self) -> i32 {
        use ErrorCode::*;
        match self {
            Cancelled => 1,
            Unknown => 2,
            InvalidArgument => 3,
            DeadlineExceeded => 4,
            NotFound => 5,
            AlreadyExists => 6,
            PermissionDenied => 7,
            ResourceExhausted => 8,
            FailedPrecondition => 9,
            Aborted => 10,
            OutOfRange => 11,
            Unimplemented => 12,
            Internal => 13,
            Unavailable => 14,
            DataLoss => 15,
            Unauthenticated => 16,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The plugin returned a `PJRT_Error` from `function`.
    #[error("{function} failed ({code:?}): {message}")]
    Plugin { function: &'static str, code: ErrorCode, message: String },
    /// maxrs refused the call before the plugin saw it.
    #[error("{0}")]
    InvalidArgument(String),
    /// The plugin's API table is too short for this function, or leaves it null.
    #[error("the PJRT plugin does not provide {function} (plugin API {major}.{minor})")]
    Unsupported { function: &'static str, major: i32, minor: i32 },
    /// The plugin library could not be loaded or initialised.
    #[error("cannot load PJRT plugin {path}: {reason}")]
    Load { path: String, reason: String },
}

impl Error {
    pub fn invalid(message: impl fmt::Display) -> Error {
        Error::InvalidArgument(message.to_string())
    }

    /// True when the plugin does not offer the function: its table lacks it, or it answered
    /// UNIMPLEMENTED. Optional queries (memory stats, cost analysis) treat this as "no data".
    pub fn is_unsupported(&self) -> bool {
        matches!(self, Error::Unsupported { .. }) || self.code() == Some(ErrorCode::Unimplemented)
    }

    /// The plugin's status code, when the plugin raised this error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Plugin { code, .. } => Some(*code),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
