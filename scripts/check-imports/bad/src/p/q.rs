pub fn thing() -> super::P { super::P }
