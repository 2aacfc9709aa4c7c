pub fn f() -> u32 { m!() }
