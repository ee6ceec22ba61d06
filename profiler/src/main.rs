fn main() {
    static OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-ebpf"));
    println!("{}", OBJ.len());
}
