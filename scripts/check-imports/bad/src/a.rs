pub fn f() -> crate::Bar { crate::Bar }
