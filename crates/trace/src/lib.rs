//! flowplane trace
