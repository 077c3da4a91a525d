//! What the PNG plots share: the font for their text.

use plotters::style::FontStyle;

/// Registers a TrueType font for the plots' text (plotters draws text with
/// ab_glyph from a registered font; the usual DejaVu and Liberation
/// locations are tried, e.g. Debian's `fonts-dejavu-core`). False if none
/// was found: plots that need text then say so, the others go without.
pub(crate) fn register_font() -> bool {
    const FONTS: &[&str] = &[
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/TTF/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    ];
    let Some(bytes) = FONTS.iter().find_map(|p| std::fs::read(p).ok()) else {
        return false;
    };
    // The registry keeps fonts for the process's life.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
}
