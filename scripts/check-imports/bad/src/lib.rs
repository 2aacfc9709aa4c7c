macro_rules! m {
    () => { 1 };
}
mod a;
mod b;
mod c;
mod d;
mod p;
pub use b::Bar;
pub use d::D;
pub struct R;
pub fn r(_: D) -> u32 { c::f() }
