/// [`crate::b::Bar`], see also [`super::b`].
pub struct Foo;
// crate::b::Bar in a line comment
/* crate::b::Bar in a /* nested */ block comment */
pub fn f() -> crate::c::C {
    let _s = "crate::b::Bar";
    let _r = r#"super::b::Bar "quoted" "#;
    let _c = '"';
    let _l: &'static str = "x";
    crate::c::C
}
pub(in crate::a) fn g() {}

#[cfg(test)]
mod tests {
    use super::*;
    use self::inner::X;
    mod inner {
        pub struct X;
        pub fn h() -> super::super::Foo { super::super::Foo }
    }
    #[test]
    fn t() { let _ = (X, f(), inner::h()); }
}
//! crate::b::Bar in an inner doc comment
#[doc = "crate::b::Bar in a doc attribute"]
pub fn lexer_edges<'a>(x: &'a str) -> &'a str {
    let _ = r##"crate::b::Bar "# still inside"##;
    let _ = b"crate::b::Bar";
    let _ = br#"crate::b::Bar"#;
    let _ = c"crate::b::Bar";
    let _q = '\'';
    let _s = "a \" crate::b::Bar";
    let _bq = b'"';
    /* outer /* inner */ crate::b::Bar still a comment */
    let _u = '\u{1F600}';
    x
}
macro_rules! own {
    () => { $crate::a::Foo };
}
pub fn use_own() -> Foo { own!() }
