use super::a::f;
pub fn arm() { let _ = f(); let _ = crate::Qux; }
