//! flowplane nf
