//! flowplane io
