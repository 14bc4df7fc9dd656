//! The HTTP message itself, as every side reads it: header rules (`headers`), the answers
//! postern writes itself (`respond`), content codings (`decode`) and gRPC framing
//! (`grpc`). It reads and shapes messages only: it holds no exchange and opens no
//! connection.

pub(crate) mod decode;
pub(crate) mod grpc;
pub(crate) mod headers;
pub mod respond;
