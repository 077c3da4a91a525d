//! flowplane table
