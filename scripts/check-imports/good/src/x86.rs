pub fn x() { let _ = crate::b::Bar(crate::Foo); crate::b::make!(); }
