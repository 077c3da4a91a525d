//! flowplane bench
