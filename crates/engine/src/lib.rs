//! flowplane engine
