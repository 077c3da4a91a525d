//! Numeric option values, one convention for every subcommand: a whole number
//! or a real with an optional decimal suffix k, M or G (`2M`, `1.5k`, `64K`),
//! checked against the option's range, which every refusal names
//! (`--reps x`: "expected a whole number between 1 and 100"). The value
//! parsers of the options are [`whole`], [`real`] and [`positive`].

/// A number and its decimal suffix's multiplier.
fn split(s: &str) -> (&str, f64) {
    let t = s.trim();
    match t.as_bytes().last() {
        Some(b'k' | b'K') => (&t[..t.len() - 1], 1e3),
        Some(b'M') => (&t[..t.len() - 1], 1e6),
        Some(b'G') => (&t[..t.len() - 1], 1e9),
        _ => (t, 1.0),
    }
}

/// `s` as a whole number (`1.5k` is 1500; `1.5` is not whole).
fn parse_whole(s: &str) -> Option<u64> {
    let (num, mult) = split(s);
    let num = num.replace('_', "");
    if mult == 1.0 {
        return num.parse().ok();
    }
    let x: f64 = num.parse().ok().filter(|x: &f64| x.is_finite() && *x >= 0.0)?;
    let v = x * mult;
    (v.fract() == 0.0 && v <= u64::MAX as f64).then_some(v as u64)
}

/// `s` as a finite real number.
fn parse_real(s: &str) -> Option<f64> {
    let (num, mult) = split(s);
    num.parse::<f64>().ok().map(|x| x * mult).filter(|x| x.is_finite())
}

/// A whole number in `lo..=hi`.
pub fn whole<T>(lo: u64, hi: u64) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    move |s: &str| {
        let v =
            parse_whole(s).ok_or_else(|| format!("expected a whole number between {lo} and {hi} (suffixes k/M/G)"))?;
        if !(lo..=hi).contains(&v) {
            return Err(format!("must be between {lo} and {hi}"));
        }
        T::try_from(v).map_err(|_| format!("must be between {lo} and {hi}"))
    }
}

/// A real number in `lo..=hi`.
pub fn real(lo: f64, hi: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let v = parse_real(s).ok_or_else(|| format!("expected a number between {lo} and {hi} (suffixes k/M/G)"))?;
        if !(lo..=hi).contains(&v) {
            return Err(format!("must be between {lo} and {hi}"));
        }
        Ok(v)
    }
}

/// A real number above 0, at most `hi` (a duration, a rate).
pub fn positive(hi: f64) -> impl Fn(&str) -> Result<f64, String> + Clone + Send + Sync + 'static {
    move |s: &str| {
        let v = parse_real(s).ok_or_else(|| format!("expected a number above 0, at most {hi} (suffixes k/M/G)"))?;
        if !(v > 0.0 && v <= hi) {
            return Err(format!("must be above 0, at most {hi}"));
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_and_ranges() {
        let w = whole::<u32>(1, 2_000_000);
        assert_eq!(w("2M"), Ok(2_000_000));
        assert_eq!(w("1.5k"), Ok(1500));
        assert_eq!(w("64K"), Ok(64_000));
        assert_eq!(w("1_000"), Ok(1000));
        assert!(w("0").unwrap_err().contains("between 1 and 2000000"));
        assert!(w("x").unwrap_err().contains("between 1 and 2000000"));
        assert!(w("1.5").unwrap_err().contains("whole number"));
        assert!(w("-1").is_err() && w("3G").is_err());
        let u8v = whole::<u8>(0, 1000);
        assert!(u8v("300").unwrap_err().contains("between 0 and 1000"));
        let p = positive(600.0);
        assert_eq!(p("0.5"), Ok(0.5));
        assert!(p("0").unwrap_err().contains("above 0") && p("nan").is_err() && p("inf").is_err());
        assert_eq!(real(0.0, 1.0)("1"), Ok(1.0));
    }
}
