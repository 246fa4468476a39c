package flamegraph

import (
	"fmt"
	"io"
)

// script is the flame graph's interaction, after Brendan Gregg's
// flamegraph.pl: click a frame to zoom into it (its ancestors stay, full
// width and faded; its descendants widen; everything else is hidden),
// click the root or "Reset zoom" to undo; "Search" (or Ctrl-F) asks for a
// regular expression, paints the frames whose full name matches and shows
// the share of the total they cover, counting nested matches once.
//
// It relies on what draw emits: every frame is a <g class="f"> holding a
// <title> "full name (value, percent)", one <rect> and, when the frame is
// wide enough, one <text>; data-s holds the short label when it differs
// from the full name. Frames' x ranges nest exactly, so "inside the zoomed
// frame" is a comparison of x ranges. The script is inert where scripts
// do not run (an <img> tag, a Markdown viewer): the picture is the same.
const script = `
var P=%g,W=%g,CW=%g,FH=%d,FS=%d;
var frames=[].slice.call(document.querySelectorAll("g.f")),zoomed=null,matchRE=null;
var reset=document.getElementById("reset"),search=document.getElementById("search"),matched=document.getElementById("matched");
frames.forEach(function(g){
  var r=g.querySelector("rect"),t=g.querySelector("title").textContent;
  g._x=+r.getAttribute("x");g._w=+r.getAttribute("width");g._y=+r.getAttribute("y");
  g._name=t.replace(/ \([^()]*\)$/,"");g._label=g.getAttribute("data-s")||g._name;g._fill=r.getAttribute("fill");
  g.addEventListener("click",function(){zoom(g)});
  g.style.cursor="pointer";
});
function fit(name,w){var n=Math.floor((w-6)/CW);if(n<3)return "";return name.length<=n?name:name.slice(0,n-2)+"..";}
function place(g,x,w){
  var r=g.querySelector("rect"),t=g.querySelector("text");
  r.setAttribute("x",x.toFixed(2));r.setAttribute("width",w.toFixed(2));
  var l=fit(g._label,w);
  if(!t&&l){t=document.createElementNS("http://www.w3.org/2000/svg","text");t.setAttribute("y",g._y+FH-4);g.appendChild(t);}
  if(t){t.setAttribute("x",(x+3).toFixed(2));t.textContent=l;}
}
function zoom(g){
  if(g===zoomed||g._w>=W-0.01){unzoom();return;}
  zoomed=g;var x0=g._x,x1=g._x+g._w,s=W/g._w,e=0.01;
  frames.forEach(function(f){
    var fx1=f._x+f._w;
    if(f._y>g._y&&f._x<=x0+e&&fx1>=x1-e){f.style.display="";f.style.opacity="0.6";place(f,P,W);}
    else if(f._y<=g._y&&f._x>=x0-e&&fx1<=x1+e){f.style.display="";f.style.opacity="";place(f,P+(f._x-x0)*s,f._w*s);}
    else{f.style.display="none";}
  });
  reset.style.display="";
}
function unzoom(){
  zoomed=null;
  frames.forEach(function(f){f.style.display="";f.style.opacity="";place(f,f._x,f._w);});
  reset.style.display="none";
}
function find(){
  if(matchRE){matchRE=null;frames.forEach(function(f){f.querySelector("rect").setAttribute("fill",f._fill);});
    search.textContent="Search";matched.textContent="";return;}
  var term=prompt("Search frames (regular expression on the full name):","");
  if(!term)return;
  var re;try{re=new RegExp(term);}catch(err){alert(err);return;}
  matchRE=re;var spans=[];
  frames.forEach(function(f){if(re.test(f._name)){f.querySelector("rect").setAttribute("fill","rgb(230,0,230)");spans.push([f._x,f._x+f._w]);}});
  spans.sort(function(a,b){return a[0]-b[0]||b[1]-a[1];});
  var covered=0,end=-1;
  spans.forEach(function(s){if(s[0]>=end){covered+=s[1]-s[0];end=s[1];}else if(s[1]>end){covered+=s[1]-end;end=s[1];}});
  search.textContent="Clear search";
  matched.textContent="Matched: "+(100*covered/W).toFixed(1)+"%%";
}
reset.addEventListener("click",unzoom);
search.addEventListener("click",find);
window.addEventListener("keydown",function(e){if((e.ctrlKey||e.metaKey)&&e.key==="f"){e.preventDefault();find();}});
`

// writeControls writes the zoom and search controls and the script. They
// come after the headings, so a document's first two <text> elements stay
// its title and subtitle.
func writeControls(w io.Writer, width, height int, plotW float64) {
	fmt.Fprintf(w, `<text id="reset" class="c" x="%d" y="24" style="display:none">Reset zoom</text>`+"\n", padX)
	fmt.Fprintf(w, `<text id="search" class="c" x="%d" y="24" text-anchor="end">Search</text>`+"\n", width-padX)
	fmt.Fprintf(w, `<text id="matched" class="s" x="%d" y="%d" text-anchor="end"></text>`+"\n", width-padX, height-8)
	fmt.Fprintf(w, "<script type=\"text/ecmascript\"><![CDATA[%s]]></script>\n", fmt.Sprintf(script, float64(padX), plotW, charWidth, frameHeight, fontSize))
}
