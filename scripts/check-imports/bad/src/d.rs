pub struct D(pub crate::R);
