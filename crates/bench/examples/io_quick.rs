fn main() {
    let r = flowplane_bench::io::run_io(&flowplane_bench::io::IoBenchOptions::default()).unwrap();
    print!("{r}");
}
