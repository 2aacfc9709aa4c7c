pub struct Bar;
pub fn g() { super::a::f(); }
