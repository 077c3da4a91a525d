//! flowplane packet
